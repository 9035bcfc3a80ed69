"""Stopping cleanly: SIGTERM / SIGUSR1 (slurm sends one before killing a job) and the first Ctrl-C
(SIGINT) ask the trainer to save at the next step boundary and exit; a second Ctrl-C exits at once.

The handler only sets a flag; the trainer polls `requested()` once per step and all ranks agree
on it through an all-reduce (MAX), so every rank saves the same step even if only one got the
signal. Exit status: 0 after pre-emption (the job did what the scheduler asked), 130 after Ctrl-C
(the shell's convention for an interrupted command).

A second Ctrl-C leaves through os._exit: no traceback, no half-published checkpoint (a save
publishes its directory and then `latest` by atomic renames, so `latest` still names the last
complete one), and the run-directory lock dies with the process.

SIGHUP (the terminal went away, or `kill -HUP`) is a pre-emption too: save and exit 0.

Launched with several processes, deepy.py passes every one of these signals on to the workers and
waits for them (megatron/training/launch_signals.py).
"""
from __future__ import annotations

import os
import signal
import sys

import torch

from megatron.errors import EXIT_INTERRUPTED

SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP, signal.SIGINT)


def _say(text: str) -> None:
    """Write from a signal handler: os.write cannot re-enter a print() the handler interrupted."""
    os.write(sys.stderr.fileno(), (text + "\n").encode())


class PreemptionHandler:
    def __init__(self):
        self.received: int | None = None
        self.interrupted = False  # a Ctrl-C arrived (decides the exit status)
        self._previous = {}

    def install(self) -> PreemptionHandler:
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGINT:
            if self.interrupted:
                sys.stdout.flush()
                _say("[signal] second Ctrl-C: exiting now without saving; `latest` names the last complete checkpoint")
                os._exit(EXIT_INTERRUPTED)
            self.interrupted = True
            _say("\n[signal] Ctrl-C: saving at the end of this step, then exiting (Ctrl-C again to exit at once)")
        if self.received is None or signum == signal.SIGINT:
            self.received = signum

    @property
    def exit_code(self) -> int:
        return EXIT_INTERRUPTED if self.interrupted else 0

    def requested(self) -> bool:
        flag = torch.tensor([1 if self.received is not None else 0], dtype=torch.int32)
        if torch.distributed.is_available() and torch.distributed.is_initialized() \
                and torch.distributed.get_world_size() > 1:
            from megatron.device import collective_device

            flag = flag.to(collective_device())
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item())

    def uninstall(self) -> None:
        for sig, prev in self._previous.items():
            signal.signal(sig, prev)
        self._previous.clear()
