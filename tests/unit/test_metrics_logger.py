"""Logging sinks: console averages over log_interval, TensorBoard events, W&B offline by default."""
import glob
import os

from megatron.training.logging import MetricsLogger


def test_console_tensorboard_and_wandb_offline(tiny_config, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)  # the default must be offline, not the env's
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = tiny_config(log_interval=2, tensorboard_dir=str(tmp_path / "tb"), use_wandb=True,
                      progress_bar=False, wandb_project="kerple-test")
    assert cfg.logging.wandb_mode == "offline"
    log = MetricsLogger(cfg, str(tmp_path), enabled=True)
    log.log_step(1, {"lm_loss": 2.0, "bias_p_mean": 1.0})
    log.log_step(2, {"lm_loss": 4.0, "bias_p_mean": 3.0})
    log.log_eval(2, "validation", {"lm_loss": 1.5, "lm_loss_ppl": 4.48}, "iteration 2")
    log.close()
    out = capsys.readouterr().out
    assert "iteration 2 | lm_loss: 3.0000E+00 | bias_p_mean: 2.0000E+00 |" in out
    assert "validation results at iteration 2 | lm_loss value: 1.500000E+00" in out
    assert glob.glob(str(tmp_path / "tb" / "events.out.tfevents.*"))
    assert glob.glob(str(tmp_path / "wandb" / "offline-run-*")), os.listdir(tmp_path)
