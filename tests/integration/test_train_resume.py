"""Training through the DeepSpeed engine on CPU: loss falls, and a resumed run continues exactly."""
import os

import pytest

from megatron.config import load_config
from tests.conftest import train_config_dict, write_yaml


def run_training(tmp_path, prefix, name, **over):
    from megatron.training.trainer import Trainer

    data = train_config_dict(tmp_path, prefix, **over)
    cfg = load_config([write_yaml(tmp_path / f"{name}.yml", data)])
    trainer = Trainer(cfg)
    losses = []
    log = trainer.log.log_step

    def capture(it, metrics, *detail):
        losses.append((it, metrics["lm_loss"]))
        log(it, metrics, *detail)

    trainer.log.log_step = capture
    result = trainer.train()
    return losses, result, trainer


def test_loss_falls_and_kerple_stats_logged(tmp_path, token_dataset):
    optimizer = {"type": "Adam", "params": {"lr": 0.01, "betas": [0.9, 0.99], "eps": 1e-8}}
    losses, result, trainer = run_training(tmp_path, token_dataset, "a", train_iters=30,
                                           optimizer=optimizer, lr_decay_style="constant")
    first = sum(v for _, v in losses[:3]) / 3
    last = sum(v for _, v in losses[-3:]) / 3
    assert last < first - 0.5, losses
    stats = result["last"]
    assert {"bias_p_mean", "bias_p_std", "bias_a_mean", "bias_a_min"} <= set(stats)
    assert "validation" in result and "test" in result


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_resume_after_save_matches_uninterrupted(tmp_path, token_dataset, dropout):
    """With dropout the masks after the resume must be the uninterrupted run's too: nothing may
    draw from the dropout generator between restoring it and the next step (data loader)."""
    ck = str(tmp_path / "ck")
    drop = {"hidden_dropout": dropout, "attention_dropout": dropout}
    full, _, _ = run_training(tmp_path, token_dataset, "full", train_iters=6,
                              gradient_accumulation_steps=2, **drop)
    # First half: save at step 3 and stop there.
    run_training(tmp_path, token_dataset, "half", train_iters=6, gradient_accumulation_steps=2,
                 save=ck, save_interval=3, exit_interval=3, **drop)
    assert open(os.path.join(ck, "latest")).read().strip() == "global_step3"
    tag = os.path.join(ck, "global_step3")
    assert os.path.isfile(os.path.join(tag, "mp_rank_00_model_states.pt"))
    assert os.path.isfile(os.path.join(tag, "resolved_config.yml"))
    assert os.listdir(os.path.join(tag, "configs")) == ["half.yml"]
    resumed, _, _ = run_training(tmp_path, token_dataset, "resume", train_iters=6,
                                 gradient_accumulation_steps=2, save=ck, load=ck, save_interval=3, **drop)
    assert [it for it, _ in resumed] == [4, 5, 6]
    expect = dict(full)
    for it, loss in resumed:
        assert loss == pytest.approx(expect[it], abs=1e-6), (it, loss, expect[it])
