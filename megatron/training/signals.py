"""Pre-emption: SIGTERM / SIGUSR1 (slurm sends one before killing a job) ask the trainer to save
at the next step boundary and exit cleanly.

The handler only sets a flag; the trainer polls `requested()` once per step and all ranks agree
on it through an all-reduce (MAX), so every rank saves the same step even if only one got the
signal.
"""
from __future__ import annotations

import signal

import torch

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class PreemptionHandler:
    def __init__(self):
        self.received: int | None = None
        self._previous = {}

    def install(self) -> PreemptionHandler:
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.received = signum

    def requested(self) -> bool:
        flag = torch.tensor([1 if self.received is not None else 0], dtype=torch.int32)
        if torch.distributed.is_available() and torch.distributed.is_initialized() \
                and torch.distributed.get_world_size() > 1:
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item())

    def uninstall(self) -> None:
        for sig, prev in self._previous.items():
            signal.signal(sig, prev)
        self._previous.clear()
