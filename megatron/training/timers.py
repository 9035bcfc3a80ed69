"""NeoX's wall-clock breakdown (`wall-clock-breakdown: true`): how long each part of a step takes.

GPT-NeoX (megatron/utils.py `Timers`, megatron/training.py `train_step`/`training_log`) times
`forward`, `backward`, `optimizer` and `batch generator` around every micro-batch and, every step,
writes each as `timers/<name>`: the seconds accumulated since the last log interval divided by the
steps in it so far (so at a log-interval step, the interval's mean seconds per iteration). Its
`forward` contains `batch generator` (get_batch runs inside forward_step); ours too, so the figures
compare with NeoX runs. NeoX synchronizes CUDA at each start and stop, or the asynchronous kernels
would be charged to whichever timer waits for them; that costs speed, hence opt-in here.

Only what the trainer times is reported: a name never timed (pipeline runs, where DeepSpeed's
engine runs the whole step) has no figure rather than a zero.
"""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

import torch

# NeoX's order (training_log's timers_to_log), for the console line; a name not here goes last
ORDER = ("forward", "backward", "optimizer", "batch generator")


class Timers:
    def __init__(self, enabled: bool, device: torch.device, log_interval: int):
        if log_interval < 1:
            raise ValueError(f"log_interval must be >= 1, got {log_interval}")
        self.enabled = enabled
        self.cuda = device.type == "cuda"
        self.log_interval = log_interval
        self.seconds: dict[str, float] = defaultdict(float)  # since the last log interval
        self.steps = 0  # steps ended since then: the divisor (NeoX's `iteration % log_interval`)

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    @contextmanager
    def __call__(self, name: str):
        """Adds the block's wall-clock seconds to `name` (nothing at all when disabled)."""
        if not self.enabled:
            yield
            return
        self._sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.seconds[name] += time.perf_counter() - start

    def end_step(self, iteration: int) -> dict[str, float]:
        """{name: mean seconds per step since the last log interval}; restarts the sums after a
        log-interval step, as NeoX's timers.log(reset=True) does. Empty when disabled."""
        if not self.enabled:
            return {}
        self.steps += 1
        names = sorted(self.seconds, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER))
        means = {name: self.seconds[name] / self.steps for name in names}
        if iteration % self.log_interval == 0:
            self.seconds.clear()
            self.steps = 0
        return means
