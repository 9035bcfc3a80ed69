"""Stopping cleanly: SIGTERM / SIGUSR1 (slurm sends one before killing a job) and the first Ctrl-C
(SIGINT) ask the trainer to save at the next step boundary and exit; a second Ctrl-C exits at once.

The handler only sets a flag; the trainer polls `requested()` once per step and all ranks agree
on it through an all-reduce (MAX), so every rank saves the same step even if only one got the
signal. Exit status: 0 after pre-emption (the job did what the scheduler asked), 130 after Ctrl-C
(the shell's convention for an interrupted command).

A second Ctrl-C leaves through os._exit: no traceback, no half-published checkpoint (a save
publishes its directory and then `latest` by atomic renames, so `latest` still names the last
complete one), and the run-directory lock dies with the process.

Launched with several processes, deepy.py runs DeepSpeed's runner, whose per-node launcher
(deepspeed.launcher.launch) starts the workers. A SIGTERM or SIGUSR1 sent to deepy.py alone
(`kill`, `docker stop`, a supervisor) used to end deepy.py at once and leave the workers training;
`forwarding_to_workers` passes it on to them, so they save and exit as one process does. Ctrl-C is
not forwarded: the terminal sends it to every process of the job already, and a second one would
make the workers exit without saving.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys

import torch

from megatron.errors import EXIT_INTERRUPTED

SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


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


FORWARDED = (signal.SIGTERM, signal.SIGUSR1)
NODE_LAUNCHER = "deepspeed.launcher.launch"  # DeepSpeed's per-node launcher module (the workers' parent)


def _targets():
    """The processes a forwarded signal goes to: the workers, i.e. the children of DeepSpeed's
    per-node launcher (sending it to the launcher itself would make it terminate them, SIGKILL after
    30 s, and exit 1). Another launcher (pdsh, mpirun, srun), or the node launcher before it has
    started the workers, gets the signal itself and passes it on its own way."""
    import psutil

    out = []
    for child in psutil.Process().children():
        try:
            workers = child.children() if NODE_LAUNCHER in " ".join(child.cmdline()) else []
        except psutil.Error:  # it ended meanwhile
            continue
        out.extend(workers or [child])
    return out


def _forward(signum, frame) -> None:
    import psutil

    targets = _targets()
    if not targets:  # nothing started yet, so nothing to save: end as the signal would have
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    _say(f"[signal] deepy.py: received {signal.Signals(signum).name}: passing it to {len(targets)} training "
         "process(es), which save at the end of their step and exit")
    for p in targets:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signum)


@contextlib.contextmanager
def forwarding_to_workers():
    """While active, SIGTERM / SIGUSR1 to this process go to the training processes it launched."""
    previous = {sig: signal.signal(sig, _forward) for sig in FORWARDED}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
