"""What one step of the Trainer reads back from the device (issue 42): each read of a device
value is a host sync (the host waits for the device's queue, the device then idles until the host
refills it). A step reads its loss at its end, and every value it logs (the gradient norm, the
per-parameter norms, the positional scheme's statistics) with one more read; before, the losses
were read after each micro-batch, our gradient norm copied each parameter's sum of squares to the
host (mid-step, before the optimizer step) and KERPLE's statistics took 18 reads.

Counted with benchmarks/step_ops.py over the whole body of the training loop's second iteration
(train_step through the end-of-step checks). On a CPU every tensor is a host tensor, so two reads
that stay on the host on a GPU are counted too, named in HOST_ONLY."""
import contextlib
import json
import math

import pytest
import torch

from benchmarks.step_ops import StepOps, counting
from megatron.config import load_config
from tests.conftest import train_config_dict, write_yaml

# Reads of host tensors on a GPU too (world size 1): the step's mean loss wrapped by torch.tensor
# for the data-parallel mean, and the stop-signal flag (a collective's result with several ranks).
HOST_ONLY = ("trainer._train_step <- trainer.train_step", "stop_signals.requested")


def run(tmp_path, prefix, **over):
    """(trainer, StepOps of the second loop iteration) of a 3-step run."""
    from megatron.training.trainer import Trainer

    cfg = load_config([write_yaml(tmp_path / "reads.yml", train_config_dict(
        tmp_path, prefix, train_iters=3, checkpoint_activations=True, gradient_clipping=1.0, **over))])
    trainer = Trainer(cfg)
    record, scope, calls = StepOps(), contextlib.ExitStack(), []
    real = trainer.train_step

    def train_step(loader):
        calls.append(None)
        if len(calls) == 2:  # the optimizer's step counters are host tensors on every device
            optimizer = getattr(trainer.engine.optimizer, "optimizer", trainer.engine.optimizer)
            host = {id(s["step"]) for s in optimizer.state.values() if torch.is_tensor(s.get("step"))}
            scope.enter_context(counting(record, host))
        elif len(calls) == 3:
            scope.close()
        return real(loader)

    trainer.train_step = train_step
    trainer.train()
    scope.close()
    return trainer, record


def device_reads(record: StepOps) -> list[str]:
    """Where each sync came from, the two innermost frames, host-only reads left out."""
    where = [" <- ".join(w.split(" <- ")[:2]) for w in record.where]
    return [w for w in where if not w.startswith(HOST_ONLY)]


def rows(tmp_path) -> list[dict]:
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        return [row for row in map(json.loads, f) if row["kind"] == "train"]


def test_a_step_reads_its_loss_and_its_logged_values_once_each(tmp_path, token_dataset):
    """Two micro-batches, a plain optimizer (DeepSpeed computes no gradient norm: ours), every
    norm logged: the losses with one read at the end of the step, everything logged with one."""
    _, record = run(tmp_path, token_dataset, gradient_accumulation_steps=2, train_micro_batch_size_per_gpu=2,
                    log_grad_norm=True, log_param_norm=True)
    assert device_reads(record) == ["host_reads.read_values <- trainer._train_step",
                                    "host_reads.read_values <- trainer._step_metrics"], record.where
    assert len(record.where) == 4, record.where


def test_a_pipeline_step_reads_its_loss_and_its_logged_values_once_each(tmp_path, token_dataset):
    """pipe-parallel-size 1 (deepy.py's path for the paper's config): the pipe engine's loss, then
    KERPLE's statistics with one read."""
    _, record = run(tmp_path, token_dataset, pipe_parallel_size=1)
    assert device_reads(record) == ["pipeline_step.pipeline_train_step <- trainer._train_step",
                                    "host_reads.read_values <- trainer._step_metrics"], record.where


def summary_item_by_item(name, x):
    """The statistics as they were read before (one .item() per value): what the logs held."""
    x = x.detach().float().flatten()
    return {f"{name}_mean": x.mean().item(), f"{name}_std": x.std().item() if x.numel() > 1 else 0.0,
            f"{name}_max": x.max().item(), f"{name}_min": x.min().item()}


@pytest.mark.parametrize("pos", ["kerple_log", "kerple_power_ap_ap"])
def test_logged_values_are_those_read_one_at_a_time(tmp_path, token_dataset, pos):
    """Read at once, the logged statistics and norms are bit for bit what reading each value alone
    gave (the last step's row against the final model, read the old way)."""
    trainer, _ = run(tmp_path, token_dataset, pos_emb=pos, log_param_norm=True)
    last = rows(tmp_path)[-1]
    scheme = trainer.model.position
    want = {}
    for name, value in scheme.clamped().items():
        want.update(summary_item_by_item(name, value))
        want.update({f"{name}_h{i}": v for i, v in enumerate(value.detach().flatten().tolist())})
    for name in scheme.clamps:
        want.update(summary_item_by_item(f"{name}_raw", getattr(scheme, name)))
    params = {name: float(p.detach().float().norm()) for name, p in trainer.model.named_parameters()}
    want.update({f"param_norm/{k}": v for k, v in params.items()})
    want["param_norm"] = math.sqrt(sum(v * v for v in params.values()))
    assert len(want) > 20 and {k: last[k] for k in want} == want


def test_the_gradient_norm_is_the_one_summed_on_the_host(tiny_config):
    """One read of every gradient's sum of squares, summed in order on the host: bit for bit the
    norm of the float64 sum the host accumulated one copied value at a time."""
    from megatron.host_reads import read_values
    from megatron.model import GPTModel
    from megatron.training import norms

    torch.manual_seed(0)
    model = GPTModel(tiny_config().model, 128)
    tokens = torch.randint(0, 128, (2, 17))
    model(tokens[:, :-1], labels=tokens[:, 1:]).backward()
    total = torch.zeros((), dtype=torch.float64)
    for p in model.parameters():
        total += p.grad.detach().float().pow(2).sum().double().cpu()
    record = StepOps()
    with counting(record):
        got = norms.norm_of_squares(read_values(norms.grad_square_sums(model)))
    assert got == math.sqrt(float(total))
    assert record.syncs == ["Tensor.tolist"]


def test_a_scheme_that_reads_its_own_statistics_still_logs_them(tmp_path, token_dataset):
    """FIRE writes stats() itself (PositionalScheme.stat_tensors hands its values on): logged as before."""
    trainer, _ = run(tmp_path, token_dataset, pos_emb="fire")
    want = trainer.model.position.stats()
    assert "fire_c" in want and {k: rows(tmp_path)[-1][k] for k in want} == want
