"""Room to run: checked at start for the directories a run writes (run-dir, and `save` when it is
elsewhere), before the launcher writes its configs and before the trainer takes its lock.

A full disk used to surface as the first failed write wherever it happened (the lock, the resolved
config, a log line): an OSError with no file name, or a traceback from a logger's thread. Now the
start fails with one message naming the directory, the free space there and the fix, as a failed
checkpoint save does (megatron/checkpoint/writer.py: the same threshold)."""
from __future__ import annotations

import errno
import os
import shutil
import tempfile

from megatron.checkpoint.writer import DISK_FULL_BYTES, free_bytes
from megatron.errors import DiskFull, UserError, describe_os_error

PROBE_BYTES = 1 << 20  # written and fsynced once: a quota or a full disk shows here, not in a log line
__all__ = ["DiskFull", "check_room", "check_run_room", "first_missing", "remove_created"]  # DiskFull's home is megatron/errors.py


def check_room(path: str, key: str) -> None:
    """Raise DiskFull (or a UserError for permissions) unless `path` (config key `key`) can be created
    and written, with at least DISK_FULL_BYTES free."""
    def full(free: int | None) -> DiskFull:
        left = f"{free / 2**20:.0f} MiB free there" if free is not None else "no space left there"
        return DiskFull(f"{key} {path!r}: the disk is full ({left}; a run needs at least {DISK_FULL_BYTES >> 20} MiB "
                        f"to start: configs, logs, checkpoints); free space there or set {key} to a directory on "
                        f"another disk (-o {key}=...)")

    created = first_missing(path)  # removed again when the check refuses: a refusal writes nothing
    try:
        os.makedirs(path, exist_ok=True)
        free = free_bytes(path)
        if free is not None and free < DISK_FULL_BYTES:
            raise full(free)
        times = os.stat(path)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".room-probe-") as f:
            f.write(b"\0" * PROBE_BYTES)
            f.flush()
            os.fsync(f.fileno())
        # the probe came and went: the directory's times as they were, so a start refused after this
        # check leaves the run directory exactly as it found it (a refusal changes nothing)
        os.utime(path, ns=(times.st_atime_ns, times.st_mtime_ns))
    except DiskFull:
        remove_created(created)
        raise
    except OSError as e:
        remove_created(created)
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise full(free_bytes(os.path.dirname(os.path.abspath(path)))) from e
        raise UserError(f"{key} {path!r}: {describe_os_error(e)}") from e


def first_missing(path: str) -> str | None:
    """The outermost directory of `path` that does not exist yet (None: it all exists)."""
    path, missing = os.path.abspath(path), None
    while not os.path.exists(path):
        missing, parent = path, os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing


def remove_created(top: str | None) -> None:
    if top:
        shutil.rmtree(top, ignore_errors=True)


def check_run_room(cfg) -> None:
    """check_room for run-dir, and for save when it lies outside run-dir."""
    run_dir = cfg.logging.run_dir
    check_room(run_dir, "run-dir")
    save = cfg.checkpoint.save
    if save and not os.path.abspath(save).startswith(os.path.abspath(run_dir) + os.sep):
        check_room(save, "save")
