"""Write a file under a temporary name and rename it into place: readers see the old file or the
complete new one, never a torn one, and a failed write leaves nothing behind.

The one home for "temp name + os.replace": datasets, index-map caches, corpus archives,
tokenizers, downloads, checkpoints' `latest`, metrics.jsonl rewrites, partial evaluation results;
and for cleaning up the temporaries a writer killed by SIGKILL left behind (nothing runs at
SIGKILL, so the next writer of the same path removes them).
"""
from __future__ import annotations

import contextlib
import os
import re


def temp_path(path: str) -> str:
    """A temporary name next to `path` (same directory, so os.replace is a rename, not a copy);
    the pid keeps two processes writing the same file from sharing one temporary."""
    return f"{path}.tmp{os.getpid()}"


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def clean_stale_temporaries(path: str) -> list[str]:
    """Remove the `temp_path(path)` files (`<path>.tmp<pid>`) whose writer is gone, or is this
    process (which is not writing `path` now: it calls this before it starts); returns the removed
    paths. A live writer's file is left alone. A pid reused by an unrelated live process keeps its
    file until that process ends: never a live writer's file removed, at worst a stale one kept."""
    directory, base = os.path.split(os.path.abspath(path))
    pattern = re.compile(re.escape(base) + r"\.tmp(\d+)")
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    removed = []
    for name in sorted(names):
        m = pattern.fullmatch(name)
        if m is None or (int(m.group(1)) != os.getpid() and process_alive(int(m.group(1)))):
            continue
        try:
            os.remove(os.path.join(directory, name))
            removed.append(os.path.join(directory, name))
        except FileNotFoundError:  # its writer finished meanwhile
            pass
    return removed


def remove_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


def fsync_path(path: str) -> None:
    """Flush a written file (or a directory's entries, after a rename) to disk, so a power loss
    after the rename cannot leave it empty or undo the rename."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_output(path: str, fsync: bool = True):
    """Yields a temporary path to write; on success it replaces `path`, on any failure (Ctrl-C
    included) it is removed and `path` is untouched.

        with atomic_output("x.npy") as tmp:
            np.save(tmp, arr)
    """
    tmp = temp_path(path)
    try:
        yield tmp
        if fsync:
            fsync_path(tmp)
        os.replace(tmp, path)
    except BaseException:
        remove_quietly(tmp)
        raise
