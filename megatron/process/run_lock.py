"""One training run per run directory: an exclusive flock on `<run_dir>/train.lock`; and one per
checkpoint directory: `<save>.lock` beside it (a second run with its own run-dir but the same
`save` would replace the first one's checkpoints step by step). The save lock sits next to the
directory, not in it, so a checkpoint directory holds exactly NeoX's layout (latest, global_step*).

The lock belongs to the process, not to the file: the kernel drops it on any exit, SIGKILL and
power loss included, so a lock file left behind by a dead run is simply locked again (and said so).
The file's text (pid, host, start time) is only there to name the holder in the refusal message.
A run directory's lock file is never deleted. An output directory's (eval.lock, `remove_on_release`)
is: results folders should hold results. Deleting it safely takes two rules: the holder unlinks the
file before it unlocks, and acquire() checks after locking that the file it locked is still the one at
the path (a process that opened the old file before the unlink would otherwise hold a lock on a
deleted file while a third locks a fresh one); if not, it opens the path again.
flock is per host (and unreliable on some network file systems): two hosts
sharing one run directory are not detected.
"""
from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import socket

from megatron.errors import UserError

LOCK_NAME = "train.lock"


class RunDirInUse(UserError):
    """Another training run holds the run directory."""


def _holder_text() -> str:
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": now}) + "\n"


def _read_holder(fd: int) -> dict:
    os.lseek(fd, 0, os.SEEK_SET)
    try:
        holder = json.loads(os.read(fd, 4096).decode() or "{}")
    except ValueError:  # torn write by a killed holder
        return {}
    return holder if isinstance(holder, dict) else {}


def describe(holder: dict) -> str:
    return (f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}, "
            f"running since {holder.get('since', '?')}")


STOP_TRAINING = "wait for it to finish, stop it (kill {pid} saves and exits at the next step), or "
RUN_DIR_FIX = STOP_TRAINING + "give this run its own directory (-o run-dir=runs/<new name>)"


class RunLock:
    """acquire() takes the lock or raises RunDirInUse naming the holder; release() (or exit) frees it.
    `path`: the lock file (default <run_dir>/train.lock); `what`, `holder` and `fix` (where {pid}
    is the holder's pid) word the refusal."""

    def __init__(self, run_dir: str, path: str | None = None, what: str | None = None, fix: str = RUN_DIR_FIX,
                 holder: str = "training run", remove_on_release: bool = False):
        self.run_dir = run_dir
        self.remove_on_release = remove_on_release
        self.path = path or os.path.join(run_dir, LOCK_NAME)
        self.what = what or f"run directory {run_dir!r}"
        self.fix = fix
        self.holder = holder
        self.fd: int | None = None
        self.stale: dict | None = None  # the dead holder whose lock file this run took over

    def _in_use(self, fd: int) -> RunDirInUse:
        holder = _read_holder(fd)
        os.close(fd)
        return RunDirInUse(f"{self.what} is in use by another {self.holder} ({describe(holder)}; lock file "
                           f"{self.path}); " + self.fix.format(pid=holder.get("pid", "<pid>")))

    def check_free(self) -> None:
        """Raise as acquire() would, without taking the lock or writing anything: for deepy.py,
        which writes into the run directory before its training process takes the lock."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise self._in_use(fd) from None
        os.close(fd)  # frees the probe's lock

    def _lock_current_file(self) -> int:
        """An fd of the file at self.path, exclusively locked (RunDirInUse when another holds it)."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise self._in_use(fd) from None
            try:
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    return fd
            except FileNotFoundError:
                pass
            os.close(fd)  # its holder removed it between our open and our lock: lock the path's file anew

    def acquire(self) -> RunLock:
        os.makedirs(self.run_dir, exist_ok=True)
        self._before = _file_state(self.path)  # for release(restore=True): a refused start changes nothing
        fd = self._lock_current_file()
        previous = _read_holder(fd)
        self.stale = previous if previous.get("pid") else None  # its holder died without releasing
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, _holder_text().encode())
        os.fsync(fd)
        self.fd = fd
        return self

    def release(self, restore: bool = False) -> None:
        """Free the lock and blank the holder (a blank file is not reported as stale), or with
        remove_on_release delete the file, still locked (see the module's docstring).
        restore: the start was refused, and a refusal changes nothing: the file gets back the bytes
        and times it had before acquire() (a file acquire() made is removed)."""
        if self.fd is None:
            return
        os.ftruncate(self.fd, 0)
        before = getattr(self, "_before", None)
        if restore and before is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        elif restore:
            os.lseek(self.fd, 0, os.SEEK_SET)
            os.write(self.fd, before[0])
            os.utime(self.fd, ns=before[1])
        if self.remove_on_release and not restore:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None

    def __del__(self):  # a Trainer dropped without finishing (tests, notebooks)
        try:
            self.release()
        except OSError:
            pass

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _file_state(path: str) -> tuple[bytes, tuple[int, int]] | None:
    """(bytes, (atime_ns, mtime_ns)) of a lock file, or None when there is none."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            return f.read(), (st.st_atime_ns, st.st_mtime_ns)
    except FileNotFoundError:
        return None


def save_dir_lock(save: str) -> RunLock:
    """The lock of checkpoint directory `save`: `<save>.lock` beside it (through symlinks, so two
    spellings of one directory share one lock)."""
    real = os.path.realpath(save)
    return RunLock(os.path.dirname(real), path=real + ".lock", what=f"checkpoint directory {save!r}",
                   fix=STOP_TRAINING + "give this run its own `save` directory (or leave `save` unset: "
                   "<run-dir>/checkpoints)")


def training_locks(cfg) -> list[RunLock]:
    """The locks of what a training run writes: its run directory and its checkpoint directory."""
    locks = [RunLock(cfg.logging.run_dir)]
    if cfg.checkpoint.save:
        locks.append(save_dir_lock(cfg.checkpoint.save))
    return locks
