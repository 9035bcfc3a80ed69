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
waits for them (megatron/launch/signals.py). Across hosts a signal arrives through the
run's store instead (megatron/process/heartbeat.py calls `deliver`), one beat later on some ranks
than on others: the all-reduce carries the signal itself, so a rank that has not had it yet stops
for the same one, and a copy that arrives after the stop was agreed is dropped (on one host it
would find the default handler back and kill the process that had just saved).
"""
from __future__ import annotations

import os
import signal
import sys

import torch

from megatron.device import collective_device
from megatron.errors import EXIT_INTERRUPTED

SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP, signal.SIGINT)


def _say(text: str) -> None:
    """Write from a signal handler: os.write cannot re-enter a print() the handler interrupted."""
    os.write(sys.stderr.fileno(), (text + "\n").encode())


_installed: PreemptionHandler | None = None  # the one whose handler is in place
_held: list[int] | None = None  # signals delivered before the handler was installed (see hold())
_agreed = False  # a stop was agreed: later deliveries are copies of its signal


def hold() -> None:
    """From now until a PreemptionHandler is installed (a trainer's set-up), a delivered signal
    waits for it instead of taking its default action."""
    global _held
    if _held is None:
        _held = []


def deliver(signum: int) -> None:
    """A signal posted by the launcher (from the heartbeat's thread): to the trainer's handler as a
    local signal would go, else held or dropped as above, else its own default action."""
    if _installed is not None:
        _installed._handle(signum, None)
    elif _agreed:
        return
    elif _held is not None:
        _held.append(signum)
    else:
        os.kill(os.getpid(), signum)


class PreemptionHandler:
    def __init__(self):
        self.received: int | None = None
        self.interrupted = False  # a Ctrl-C arrived (decides the exit status)
        self._previous = {}

    def install(self) -> PreemptionHandler:
        global _installed, _held
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        _installed = self
        held, _held = _held or [], None
        for signum in held:
            self._handle(signum, None)
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
        """Whether any rank received a stop signal; then every rank takes the same one (the
        highest number) and the same Ctrl-C state."""
        global _agreed
        flag = torch.tensor([self.received or 0, int(self.interrupted)], dtype=torch.int32)
        if torch.distributed.is_available() and torch.distributed.is_initialized() \
                and torch.distributed.get_world_size() > 1:
            flag = flag.to(collective_device())
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        signum, interrupted = (int(v) for v in flag.tolist())
        if signum:
            self.received, self.interrupted, _agreed = signum, bool(interrupted), True
        return bool(signum)

    def uninstall(self) -> None:
        global _installed
        for sig, prev in self._previous.items():
            signal.signal(sig, prev)
        self._previous.clear()
        if _installed is self:
            _installed = None
