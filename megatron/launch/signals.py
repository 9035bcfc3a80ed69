"""deepy.py with several processes: a signal to it reaches the training processes, and it does not
exit before they do.

deepy.py runs DeepSpeed's runner, whose per-node launcher (deepspeed.launcher.launch) starts the
workers. Before, `kill -INT` (or SIGTERM, SIGHUP) to deepy.py alone ended it at once and left the
launcher and the workers training, unsaved, holding the run's locks. Now, while the runner runs:

- The local launcher starts in a process group of its own, so the terminal's Ctrl-C reaches
  deepy.py only and deepy.py passes it on once: a Ctrl-C that arrived twice (terminal + deepy.py)
  would make the workers exit without saving, and DeepSpeed's launcher, given a Ctrl-C, sends the
  workers SIGTERM and SIGKILLs them 30 s later, whatever their save is doing.
- SIGINT, SIGTERM, SIGHUP and SIGUSR1 go to the training processes (the launcher's children:
  not to the launcher, for that reason, nor to their DataLoader workers, which would die under a
  step). The workers save at the next step boundary and exit (megatron/process/stop_signals.py); the
  launcher then ends with their status. A second Ctrl-C is passed on too: the workers exit at once.
- Another launcher (pdsh, mpirun, srun), or the local launcher before it has started the workers,
  gets the signal itself and passes it on its own way.
- Ctrl-Z (SIGTSTP) stops the whole group and `fg` (SIGCONT) continues it, as before.
- deepy.py then waits for every process of the tree, at most GRACE_S seconds after the first
  signal; what is left is SIGKILLed. Either way it ends with one line naming the checkpoint that
  `latest` names (and whether this stop saved it) and the state of the run's locks.
- A signal that arrived after the last step (the run finished anyway) is said so, and when
  STOP_OUTCOME_ENV names a file, deepy.py writes the stop's outcome there ("resume": stopped before
  its end; "finished"): Slurm's batch scripts (tools/slurm/supervise.sh) requeue only a run that has
  something left to do.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import types

from megatron.atomic_io import atomic_output
from megatron.checkpoint.tags import read_latest
from megatron.errors import UserError, debug_enabled
from megatron.launch.output import OutputRelay
from megatron.process.heartbeat import KILL_NOW, post_signal
from megatron.process.run_lock import RunDirInUse, training_locks

GRACE_S = float(os.environ.get("KERPLE_STOP_GRACE_S", 600))  # the slowest save we expect, and its step
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)
NODE_LAUNCHER = "deepspeed.launcher.launch"  # DeepSpeed's per-node launcher module (the workers' parent)
STOP_OUTCOME_ENV = "KERPLE_STOP_OUTCOME"  # a file deepy.py writes a signalled stop's outcome to (see the module)


def _say(text: str) -> None:
    """Write from a signal handler: os.write cannot re-enter a print() the handler interrupted. A
    terminal that hung up (SIGHUP) fails the write: the stop goes on without the line."""
    with contextlib.suppress(OSError):
        os.write(sys.stderr.fileno(), (text + "\n").encode())


class _OwnGroupPopen(subprocess.Popen):
    """Popen for DeepSpeed's runner: what it starts runs in a process group of its own with stdin
    closed (a background group reading the terminal would be stopped; ssh runs with BatchMode, so
    nothing asks for a password). A remote launcher's (pdsh, srun, mpirun: anything but the local
    launcher, which the runner starts with this Python) output goes through an OutputRelay."""

    relays: list = []  # the relays of the launch in progress (launcher_in_own_group empties it)

    def __init__(self, args, *rest, **kwargs):
        argv = list(args) if isinstance(args, (list, tuple)) else [args]
        kwargs.setdefault("process_group", 0)
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        remote = bool(argv) and str(argv[0]) != sys.executable
        if remote:
            kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        super().__init__(args, *rest, **kwargs)
        if remote:
            _OwnGroupPopen.relays.append(OutputRelay(self.stdout, keep_all=debug_enabled()).start())


class _SignalShim:
    """The runner's view of the `signal` module: its pdsh handler for SIGINT/SIGTERM (send SIGINT
    and SIGTERM to pdsh, `pkill` the launchers on every host, exit 1 a second later: no worker
    saves) is not installed; the Supervisor's stays."""

    def __getattr__(self, name):
        return getattr(signal, name)

    @staticmethod
    def signal(signum, handler):
        if signum in FORWARDED:
            return signal.getsignal(signum)
        return signal.signal(signum, handler)


@contextlib.contextmanager
def launcher_in_own_group(runner_module):
    """While active, `runner_module` (deepspeed.launcher.runner) starts its launchers in new process
    groups, relays a remote launcher's output and leaves the signal handlers to the Supervisor;
    only that module's names `subprocess` and `signal` are replaced."""
    shim = types.ModuleType("subprocess")
    shim.__dict__.update(vars(subprocess))
    shim.Popen = _OwnGroupPopen
    previous = runner_module.subprocess, getattr(runner_module, "signal", signal)
    runner_module.subprocess, runner_module.signal = shim, _SignalShim()
    _OwnGroupPopen.relays = []
    try:
        yield _OwnGroupPopen.relays
    finally:
        for relay in _OwnGroupPopen.relays:
            relay.join()
        runner_module.subprocess, runner_module.signal = previous


def _targets():
    """The processes a signal goes to: the workers, i.e. the children of DeepSpeed's per-node
    launcher; else the launcher itself (not started them yet, or another launcher)."""
    import psutil  # lazy: psutil, a DeepSpeed requirement (not ours), only to signal processes

    out = []
    for child in psutil.Process().children():
        try:
            workers = child.children() if NODE_LAUNCHER in " ".join(child.cmdline()) else []
        except psutil.Error:  # it ended meanwhile
            continue
        out.extend(workers or [child])
    return out


class Supervisor:
    """Signal handling around the launch; `report` (a StopReport) words the end."""

    def __init__(self, report, grace_s: float = GRACE_S, rendezvous: tuple[str, int] | None = None):
        self.report = report
        self.grace_s = grace_s
        # (MASTER_ADDR, MASTER_PORT) of a launch across hosts: the workers are not our descendants
        # there (ssh/srun started them), so a signal reaches them through the run's store.
        self.rendezvous = rendezvous
        self.first: int | None = None  # the first signal
        self.deadline: float | None = None  # monotonic time after which what is left is killed
        self.tree: dict = {}  # pid -> psutil.Process: everything deepy.py started, seen at each signal
        self.killed: dict[int, str] = {}  # pid -> its command line, for the report
        self._previous: dict = {}
        self._lock = threading.Lock()

    def _remember_tree(self) -> None:
        import psutil  # lazy: psutil, as in _targets

        with contextlib.suppress(psutil.Error):
            for p in psutil.Process().children(recursive=True):
                self.tree.setdefault(p.pid, p)

    def _forward(self, signum, frame) -> None:
        if self.rendezvous is not None:
            return self._post(signum)
        import psutil  # lazy: psutil, as in _targets

        targets = _targets()
        if not targets:  # nothing started yet, so nothing to save: end as the signal would have
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self._remember_tree()
        name = signal.Signals(signum).name
        _say(f"[signal] deepy.py: received {name}: passing it to {len(targets)} training process(es), which save "
             f"at the end of their step and exit; waiting for them (at most {self.grace_s:g} s, then SIGKILL)")
        for p in targets:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signum)
        if self.first is None:
            self.first, self.deadline = signum, time.monotonic() + self.grace_s
            self.report.mark()
            # in a thread: the runner may be waiting on a launcher that waits on a stuck worker
            threading.Thread(target=self._wait_or_kill, daemon=True).start()

    def _post(self, signum) -> None:
        """Across hosts: post the signal in the run's store, from a thread that retries until the
        workers have started it (or the grace period ends); each worker's heartbeat delivers it."""
        name = signal.Signals(signum).name
        _say(f"[signal] deepy.py: received {name}: passing it to every training process on every host (through "
             f"the run's rendezvous store), which save at the end of their step and exit; waiting for them (at most "
             f"{self.grace_s:g} s, then they are stopped)")
        if self.first is None:
            self.first, self.deadline = signum, time.monotonic() + self.grace_s
            self.report.mark()
            threading.Thread(target=self._wait_or_kill, daemon=True).start()

        def post():
            while not post_signal(*self.rendezvous, signum) and time.monotonic() < self.deadline:
                time.sleep(1)

        threading.Thread(target=post, daemon=True).start()

    def _suspend(self, signum, frame) -> None:
        """Ctrl-Z: the launched group stops with deepy.py (it is not in the terminal's group)."""
        for p in _targets():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(os.getpgid(p.pid), signal.SIGTSTP)
        os.kill(os.getpid(), signal.SIGSTOP)

    def _resume(self, signum, frame) -> None:
        for p in _targets():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(os.getpgid(p.pid), signal.SIGCONT)

    def _alive(self) -> list:
        import psutil  # lazy: psutil, as in _targets

        out = []
        for p in self.tree.values():
            with contextlib.suppress(psutil.Error):
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
        return out

    def _kill_alive(self) -> None:
        import psutil  # lazy: psutil, as in _targets

        with self._lock:
            for p in self._alive():
                with contextlib.suppress(psutil.Error):
                    name = " ".join(" ".join(p.cmdline()).split())
                    p.kill()
                    self.killed.setdefault(p.pid, f"{p.pid} ({name[:60]}{'...' if len(name) > 60 else ''})")

    def _wait(self, deadline: float) -> None:
        while self._alive() and time.monotonic() < deadline:
            time.sleep(0.05)

    def _wait_or_kill(self) -> None:
        """Until every process of the tree has ended, or the deadline: then SIGKILL what is left
        (across hosts, the workers are told to exit at once first)."""
        self._remember_tree()
        self._wait(self.deadline)
        if self.rendezvous is not None and self._alive():
            if post_signal(*self.rendezvous, KILL_NOW):
                self._wait(time.monotonic() + 10)
        self._remember_tree()  # a process started meanwhile is killed too
        self._kill_alive()
        self._wait(time.monotonic() + 5)  # a killed process ends (and drops its locks) on delivery

    def __enter__(self) -> Supervisor:
        for sig in FORWARDED:
            self._previous[sig] = signal.signal(sig, self._forward)
        self._previous[signal.SIGTSTP] = signal.signal(signal.SIGTSTP, self._suspend)
        self._previous[signal.SIGCONT] = signal.signal(signal.SIGCONT, self._resume)
        return self

    def __exit__(self, *exc) -> None:
        """After the runner returned: the processes it left (a launcher that ended before its
        workers) are waited for too, within the same grace period."""
        try:
            if self.first is not None:
                self._remember_tree()
                self._wait_or_kill()
                _say(f"deepy.py: stopped by {signal.Signals(self.first).name}: " + self.stop_report())
                self.report.record_outcome()
        finally:
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)

    def stop_report(self) -> str:
        if self.killed:
            head = (f"the training processes did not exit within {self.grace_s:g} s: killed (SIGKILL) "
                    f"{', '.join(self.killed.values())}; ")
        else:
            head = "every training process has exited; "
        return head + self.report.summary()

    @property
    def exit_code(self) -> int | None:
        """The status deepy.py exits with when it killed what was left (None: the runner's)."""
        return 128 + signal.SIGKILL if self.killed else None




class StopReport:
    """What a stop kept: the checkpoint `latest` names (and whether it was saved after the signal)
    and whether the run's locks are free. `mark()` at the first signal, `summary()` at the end."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.before: str | None = None

    def _latest(self) -> str | None:
        try:
            return read_latest(self.cfg.checkpoint.save) if self.cfg.checkpoint.save else None
        except UserError as e:
            return f"an unreadable tag ({e})"

    def mark(self) -> None:
        self.before = self._latest()

    def finished(self) -> bool:
        """Whether the run reached its end (megatron/training/finished.py's rule) despite the signal."""
        from megatron.training.finished import finished_iteration  # lazy: yaml and the metrics reader

        return finished_iteration(self.cfg) is not None

    def record_outcome(self) -> None:
        """"finished" or "resume" into the file STOP_OUTCOME_ENV names, if it names one."""
        path = os.environ.get(STOP_OUTCOME_ENV)
        if path:
            with atomic_output(path, fsync=False) as tmp, open(tmp, "w") as f:
                f.write("finished\n" if self.finished() else "resume\n")

    def summary(self) -> str:
        save, now = self.cfg.checkpoint.save, self._latest()
        if save and self.finished():
            saved = f"the run had already finished ({now}, its last step): nothing to resume"
        elif not save:
            saved = "nothing was saved (no `save` directory)"
        elif now is None:
            saved = f"no checkpoint in {save}"
        elif now != self.before:
            saved = f"saved {now} ({save}/latest names it)"
        else:
            saved = f"no new checkpoint: {save}/latest still names {now}"
        held = []
        for lock in training_locks(self.cfg):
            try:
                lock.check_free()
            except RunDirInUse as e:
                held.append(str(e))
        return f"{saved}; " + ("the run's locks are released" if not held else "still locked: " + "; ".join(held))


def run_child(cmd: list[str], **popen_kwargs) -> tuple[int, int | None]:
    """(exit status, the first signal received or None) of `cmd` run to its end by a tool that runs
    deepy.py in turn (tools/run_matrix.py). The child gets a process group of its own, so the
    terminal's Ctrl-C reaches it once, through this process, and a signal to this process alone
    (`kill -INT`, SIGTERM, SIGHUP) reaches it too; then this process waits for it to save and exit.
    subprocess.call would SIGKILL the child on Ctrl-C (KeyboardInterrupt), mid-save, leaving its
    workers without the launcher that passes them signals. The child does not write STOP_OUTCOME_ENV's
    file: one run finished is not the tool's whole work finished (its file stays empty: requeue)."""
    env = {k: v for k, v in popen_kwargs.pop("env", os.environ).items() if k != STOP_OUTCOME_ENV}
    proc = subprocess.Popen(cmd, process_group=0, stdin=subprocess.DEVNULL, env=env, **popen_kwargs)
    received: list[int] = []

    def forward(signum, frame):
        received.append(signum)
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        rc = proc.wait()  # a handled signal does not interrupt the wait (PEP 475)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return rc, (received[0] if received else None)
