"""TensorBoard (and W&B) carry GPT-NeoX's tags, at NeoX's steps and in NeoX's units, so NeoX
dashboards find them: train/* every step, runtime/* at log-interval steps (iteration_time in
seconds), timers/* with wall-clock-breakdown; metrics.jsonl keeps our names. W&B's offline files
are not readable back from Python (wandb >= 0.19 writes them from its Go core), so its run object is
replaced by a recorder: what the trainer hands W&B must be what TensorBoard got."""
import glob
import json
import time

import pytest

from megatron.config import load_config
from megatron.training.neox_runtime import neox_flops_per_iteration
from tests.conftest import train_config_dict, write_yaml

SEQ, BATCH = 32, 4  # train_config_dict's seq-length and micro batch (gas 1, one process)


def scalars(tb_dir) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} of every scalar in the run's event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = {}
    for path in glob.glob(str(tb_dir / "events.out.tfevents.*")):
        acc = EventAccumulator(path, size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, {}).update({e.step: e.value for e in acc.Scalars(tag)})
    return out


def train(tmp_path, prefix, **over) -> tuple[dict, list[dict], float]:
    """(TensorBoard scalars, metrics.jsonl train rows, wall seconds of train())."""
    from megatron.training.trainer import Trainer

    data = train_config_dict(tmp_path, prefix, train_iters=4, log_interval=2, **over)
    trainer = Trainer(load_config([write_yaml(tmp_path / "names.yml", data)]))
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        rows = [row for row in map(json.loads, f) if row["kind"] == "train"]
    return scalars(tmp_path / "run" / "tensorboard"), rows, wall


class WandbRun:
    def __init__(self):
        self.scalars: dict[str, dict[int, float]] = {}

    def log(self, tags, step):
        for k, v in tags.items():
            self.scalars.setdefault(k, {})[step] = v

    def finish(self):
        pass


def test_neox_tags_steps_and_units(tmp_path, token_dataset, capsys, monkeypatch):
    wandb = pytest.importorskip("wandb")
    run = WandbRun()
    monkeypatch.setattr(wandb, "init", lambda **kw: run)
    tb, rows, wall = train(tmp_path, token_dataset, wall_clock_breakdown=True, log_grad_norm=True,
                           eval_interval=2, eval_iters=1, use_wandb=True)
    assert set(run.scalars) == set(tb)  # the same tags at the same steps (float32 in TensorBoard)
    assert all(run.scalars[t] == pytest.approx(tb[t], rel=1e-5) for t in tb)
    # every step, as NeoX's training_log
    for tag in ("train/lm_loss", "train/learning_rate", "train/grad_norm"):
        assert sorted(tb[tag]) == [1, 2, 3, 4], tag
    assert tb["train/lm_loss"][3] == pytest.approx(rows[2]["lm_loss"])
    assert any(t.startswith("gradient_norms/") for t in tb) and not any(t.startswith("train/grad_norm/") for t in tb)
    assert sorted(tb["validation/lm_loss"]) == [2, 4] and "validation/lm_loss_ppl" in tb
    # our per-step speed stays in metrics.jsonl only: NeoX's is the interval's (runtime/*)
    assert not {"train/elapsed_time_per_iteration_ms", "train/samples_per_sec", "train/tokens_per_sec"} & set(tb)
    assert all("elapsed_time_per_iteration_ms" in row and "samples_per_sec" in row for row in rows)

    # runtime/* at log-interval steps only; iteration_time in seconds: at least the mean of the
    # interval's own step times (it also holds the evaluation at step 2), at most all of train()
    names = ("samples_per_sec", "iteration_time", "steps_per_sec", "tokens_per_sec", "flops_per_sec_per_gpu")
    for name in names:
        assert sorted(tb[f"runtime/{name}"]) == [2, 4], name
    assert "runtime/model_flops_utilization" not in tb  # no peak FLOP/s known for a CPU
    for step in (2, 4):
        seconds = tb["runtime/iteration_time"][step]
        own = sum(row["elapsed_time_per_iteration_ms"] for row in rows[step - 2:step]) / 2 / 1000
        assert 0.99 * own <= seconds <= wall / 2, (own, seconds, wall)
        assert tb["runtime/samples_per_sec"][step] == pytest.approx(BATCH / seconds, rel=1e-5)
        assert tb["runtime/steps_per_sec"][step] == pytest.approx(1 / seconds, rel=1e-5)
        assert tb["runtime/tokens_per_sec"][step] == pytest.approx(BATCH * SEQ / seconds, rel=1e-5)
    # NeoX's get_actual_flops for the tiny model (2 layers, hidden 32, vocab padded to 128), one process
    flops = 24 * 3 * BATCH * SEQ * 2 * 32 ** 2 * (1 + SEQ / (6 * 32) + 128 / (16 * 2 * 32))
    assert neox_flops_per_iteration(BATCH, SEQ, 2, 32, 128, 3) == pytest.approx(flops)
    assert tb["runtime/flops_per_sec_per_gpu"][4] == pytest.approx(flops / tb["runtime/iteration_time"][4], rel=1e-5)

    # timers/*: every step, seconds per step; forward holds the batch generator, as NeoX's does
    timers = {t.removeprefix("timers/"): v for t, v in tb.items() if t.startswith("timers/")}
    assert set(timers) == {"forward", "backward", "optimizer", "batch generator"}
    for step in (1, 2, 3, 4):
        assert timers["batch generator"][step] <= timers["forward"][step]
    parts = timers["forward"][2] + timers["backward"][2] + timers["optimizer"][2]
    assert 0 < parts <= tb["runtime/iteration_time"][2]  # seconds too, within the interval's step
    assert capsys.readouterr().out.count("time (ms) | forward: ") == 2  # NeoX's line, each log interval


def test_no_timers_without_wall_clock_breakdown(tmp_path, token_dataset):
    tb, _, _ = train(tmp_path, token_dataset)
    assert not [t for t in tb if t.startswith("timers/")]
    assert sorted(tb["runtime/iteration_time"]) == [2, 4]
