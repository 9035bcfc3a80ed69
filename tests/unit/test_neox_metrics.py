"""NeoX's TensorBoard/W&B tags (neox_names.py), its runtime/* figures (neox_runtime.py) and its
timers (timers.py), without training: the name table, the interval arithmetic, the FLOP formula
with the activation-checkpointing factor, and both sinks getting the same tags."""
import pytest
import torch

from megatron.process.logging import MetricsLogger
from megatron.process.neox_names import step_tags
from megatron.training import neox_runtime
from megatron.training.neox_runtime import IntervalRuntime, RunShape, neox_flops_per_iteration
from megatron.training.timers import Timers


def test_step_tags_are_neoxs():
    tags = step_tags({"lm_loss": 2.0, "learning_rate": 1e-3, "grad_norm": 0.5, "bias_p_mean": 1.0,
                      "elapsed_time_per_iteration_ms": 12.0, "samples_per_sec": 3.0, "tokens_per_sec": 96.0,
                      "grad_norm/layers.0.w": 0.1, "param_norm/layers.0.w": 2.0})
    assert tags == {"train/lm_loss": 2.0, "train/learning_rate": 1e-3, "train/grad_norm": 0.5,
                    "train/bias_p_mean": 1.0, "gradient_norms/layers.0.w": 0.1, "parameter_norms/layers.0.w": 2.0}


def test_neox_flops_formula_and_checkpointing_factor():
    # NeoX 20B-like: B 1538, s 2048, l 44, h 6144, V 50432 (megatron/logging.py get_actual_flops)
    args = (1538, 2048, 44, 6144, 50432)
    base = 24 * 1538 * 2048 * 44 * 6144 ** 2 * (1 + 2048 / (6 * 6144) + 50432 / (16 * 44 * 6144))
    assert neox_flops_per_iteration(*args, 3) == pytest.approx(3 * base)
    assert neox_flops_per_iteration(*args, 4) / neox_flops_per_iteration(*args, 3) == pytest.approx(4 / 3)


def shape(**over) -> RunShape:
    return RunShape(**{**dict(batch=8, seq_length=64, num_layers=2, hidden_size=32, vocab_size=128,
                              checkpoint_activations=False, world_size=2, peak=None), **over})


def test_runtime_figures_at_log_interval_steps(monkeypatch):
    clock = iter([100.0, 103.0, 109.0])  # start, step 3 (a resumed run's short interval), step 6
    monkeypatch.setattr(neox_runtime.time, "perf_counter", lambda: next(clock))
    runtime = IntervalRuntime(shape(), log_interval=3)
    runtime.start()
    first = None
    for it in (3, 4, 5, 6):
        out = runtime.end_step(it)
        if it == 3:
            first = out
        elif it < 6:
            assert out is None
    # step 3 ended a 1-step interval of 3 s; steps 4-6 took 6 s: 2 s each, in seconds
    assert first["iteration_time"] == 3.0 and out["iteration_time"] == 2.0
    assert out["samples_per_sec"] == 4.0 and out["steps_per_sec"] == 0.5 and out["tokens_per_sec"] == 256.0
    assert out["flops_per_sec_per_gpu"] == pytest.approx(neox_flops_per_iteration(8, 64, 2, 32, 128, 3) / (2 * 2))
    assert "model_flops_utilization" not in out


def test_utilisation_is_percent_and_hfu_counts_recomputation():
    out = IntervalRuntime(shape(peak=1e9, checkpoint_activations=True), 1).figures(1.0)
    model = neox_flops_per_iteration(8, 64, 2, 32, 128, 3) / 2
    assert out["model_flops_utilization"] == pytest.approx(100 * model / 1e9)
    assert out["hardware_flops_utilization"] == pytest.approx(100 * model * 4 / 3 / 1e9)


def test_timers_mean_over_the_interval_so_far_then_restart(monkeypatch):
    clock = iter([0.0, 1.0, 0.0, 3.0, 0.0, 5.0])
    monkeypatch.setattr("megatron.training.timers.time.perf_counter", lambda: next(clock))
    timers = Timers(True, torch.device("cpu"), log_interval=2)
    means = []
    for it in (1, 2, 3):
        with timers("forward"):
            pass
        means.append(timers.end_step(it)["forward"])
    assert means == [1.0, 2.0, 5.0]  # (1)/1, (1+3)/2, then a new interval: 5/1
    assert Timers(False, torch.device("cpu"), 2).end_step(1) == {}


@pytest.mark.parametrize("make", [lambda: Timers(True, torch.device("cpu"), 0),
                                  lambda: IntervalRuntime(shape(), 0)])
def test_log_interval_below_one_is_refused(make):
    with pytest.raises(ValueError, match="log_interval must be >= 1, got 0"):
        make()


class Recorder:
    def __init__(self):
        self.rows = []

    def log(self, tags, step):
        self.rows.extend((step, k, v) for k, v in tags.items())

    def add_scalar(self, tag, value, step):
        self.rows.append((step, tag, value))


def test_tensorboard_and_wandb_get_the_same_tags(tiny_config, tmp_path):
    log = MetricsLogger(tiny_config(progress_bar=False, log_interval=1, tensorboard_dir=None), str(tmp_path))
    log.tb, log.wandb = Recorder(), Recorder()
    log.log_step(1, {"lm_loss": 2.0, "samples_per_sec": 3.0})
    log.log_timers(1, {"forward": 0.5})
    log.log_runtime(1, {"iteration_time": 0.7})
    log.log_eval(1, "validation", {"lm_loss": 1.5}, "iteration 1")
    expected = [(1, "train/lm_loss", 2.0), (1, "timers/forward", 0.5), (1, "runtime/iteration_time", 0.7),
                (1, "validation/lm_loss", 1.5)]
    assert log.tb.rows == expected and log.wandb.rows == expected
    log.tb = log.wandb = None
    log.close()
