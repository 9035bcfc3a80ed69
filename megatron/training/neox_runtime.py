"""GPT-NeoX's `runtime/*` figures, computed as NeoX computes them (EleutherAI/gpt-neox,
megatron/logging.py `training_log`, `get_actual_flops`, `get_forward_backward_flops`), so a
dashboard that compares NeoX runs compares ours on the same footing.

When: at each log-interval step only, for the interval that ends there. iteration_time is NeoX's
`interval time`: wall-clock seconds from the previous log-interval step (or the start of the loop)
to this one, whatever the loop did in between (evaluation, checkpoint saves, logging included),
divided by the steps in it. NeoX divides by log-interval even when a resumed run's first interval
is shorter; we divide by the steps actually taken, so that interval is not reported faster.

FLOPs (Narayanan et al. 2021, arXiv 2104.04473, by way of Megatron-DeepSpeed), per optimizer step:

    24 * factor * B * s * l * h^2 * (1 + s / (6 h) + V / (16 l h))

B = train-batch-size, s = seq-length, l = layers, h = hidden size, V = the padded vocabulary.
factor 3 (forward + backward) gives the model's FLOPs (MFU); factor 4 with checkpoint-activations
(the recomputed forward) gives the work the hardware did (flops_per_sec_per_gpu, HFU). Divided by
the processes of the run (NeoX's world size), whatever their parallel layout. The formula assumes
NeoX's classic block (4h MLP, one key/value head per query head): for gated MLPs, grouped-query
attention or another intermediate size it is NeoX's approximation, not a count of this model. Our
own `mfu` (throughput.py: 6N + 12 l h s per token over the real parameters, a fraction, no
recomputation) stays in metrics.jsonl and as train/mfu.

NeoX reports model/hardware_flops_utilization (percent) only when `peak_theoretical_tflops` is
set; we use the peak of the device we recognise (throughput.PEAKS, CUDA only) and omit them where
there is none.
"""
from __future__ import annotations

import time
from dataclasses import dataclass


def neox_flops_per_iteration(batch: int, seq_length: int, num_layers: int, hidden_size: int,
                             vocab_size: int, factor: int) -> float:
    """FLOPs of one optimizer step by NeoX's formula (module docstring); factor 3 or 4."""
    return (24.0 * factor * batch * seq_length * num_layers * hidden_size ** 2
            * (1.0 + seq_length / (6.0 * hidden_size) + vocab_size / (16.0 * num_layers * hidden_size)))


@dataclass(frozen=True)
class RunShape:
    """What NeoX's figures read from its arguments."""
    batch: int  # train-batch-size: samples per optimizer step over all data-parallel ranks
    seq_length: int
    num_layers: int
    hidden_size: int
    vocab_size: int  # padded
    checkpoint_activations: bool
    world_size: int
    peak: float | None  # FLOP/s of one device; None: no utilisation figures


class IntervalRuntime:
    """Counts steps and wall clock between log-interval steps; start() when the loop starts."""

    def __init__(self, shape: RunShape, log_interval: int):
        if log_interval < 1:
            raise ValueError(f"log_interval must be >= 1, got {log_interval}")
        self.shape = shape
        self.log_interval = log_interval
        self.since = None
        self.steps = 0

    def start(self) -> None:
        self.since = time.perf_counter()
        self.steps = 0

    def end_step(self, iteration: int) -> dict[str, float] | None:
        """NeoX's runtime figures (keys without `runtime/`) at a log-interval step, else None."""
        assert self.since is not None, "IntervalRuntime.start() was not called"
        self.steps += 1
        if iteration % self.log_interval:
            return None
        now = time.perf_counter()
        iteration_time = max(now - self.since, 1e-9) / self.steps
        self.since, self.steps = now, 0
        return self.figures(iteration_time)

    def figures(self, iteration_time: float) -> dict[str, float]:
        s = self.shape
        samples_per_sec = s.batch / iteration_time
        shape = (s.batch, s.seq_length, s.num_layers, s.hidden_size, s.vocab_size)
        hardware = neox_flops_per_iteration(*shape, 4 if s.checkpoint_activations else 3)
        out = {
            "samples_per_sec": samples_per_sec,
            "iteration_time": iteration_time,  # seconds, as NeoX's
            "steps_per_sec": 1.0 / iteration_time,
            "tokens_per_sec": samples_per_sec * s.seq_length,
            "flops_per_sec_per_gpu": hardware / (iteration_time * s.world_size),
        }
        if s.peak:
            model = neox_flops_per_iteration(*shape, 3)
            out["model_flops_utilization"] = 100.0 * model / (iteration_time * s.world_size) / s.peak
            out["hardware_flops_utilization"] = 100.0 * out["flops_per_sec_per_gpu"] / s.peak
        return out
