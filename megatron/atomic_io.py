"""Write a file under a temporary name and rename it into place: readers see the old file or the
complete new one, never a torn one, and a failed write leaves nothing behind.

The one home for "temp name + os.replace": datasets, index-map caches, corpus archives,
tokenizers, downloads, checkpoints' `latest`, metrics.jsonl rewrites, partial evaluation results.
"""
from __future__ import annotations

import contextlib
import os


def temp_path(path: str) -> str:
    """A temporary name next to `path` (same directory, so os.replace is a rename, not a copy);
    the pid keeps two processes writing the same file from sharing one temporary."""
    return f"{path}.tmp{os.getpid()}"


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
