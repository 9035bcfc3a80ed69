"""Write a file under a temporary name and rename it into place: readers see the old file or the
complete new one, never a torn one, and a failed write leaves nothing behind.

The one home for "temp name + os.replace": datasets, index-map caches, corpus archives,
tokenizers, downloads, checkpoints' `latest`, metrics.jsonl rewrites, partial evaluation results;
and for cleaning up the temporaries a writer killed by SIGKILL left behind (nothing runs at
SIGKILL, so the next writer of the same path removes them). Whole output directories (a merged
checkpoint, an HF export) are published the same way (`atomic_directory`), and an existing output
is replaced only when the user said so (`refuse_existing_output`, the tools' --overwrite).
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil

from megatron.errors import UserError


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
        found = os.path.join(directory, name)
        try:
            if os.path.isdir(found) and not os.path.islink(found):  # an atomic_directory's
                shutil.rmtree(found)
            else:
                os.remove(found)
            removed.append(found)
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
    except BaseException as e:
        remove_quietly(tmp)
        if isinstance(e, OSError) and not e.filename:  # a write() names no file: the message names this one
            e.filename = path
        raise


class OutputExists(UserError):
    """An output that is already there and was not asked to be replaced."""


def refuse_existing_output(path: str, overwrite: bool, flag: str, what: str = "") -> None:
    """OutputExists when `path` is a file or a non-empty directory and not `overwrite`: one message
    naming it, what it holds (`what`, e.g. 'checkpoints global_step2, global_step4') and the two fixes."""
    if overwrite or not os.path.lexists(path):
        return
    if os.path.isdir(path) and not os.listdir(path):
        return  # an empty directory (made ahead by the user) holds nothing to lose
    raise OutputExists(f"{flag} {path} already exists{f' and holds {what}' if what else ''}; refusing to replace it: "
                       f"choose another {flag}, or pass --overwrite to replace it")


@contextlib.contextmanager
def atomic_directory(path: str):
    """Yields a fresh temporary directory next to `path` to fill; on success it becomes `path`
    (an existing `path` is renamed aside, the new one renamed in, then the old one deleted), on
    any failure it is removed and `path` is untouched. Readers see the old directory or the whole
    new one; a crash between the two renames leaves no `path` and the old one as `<path>.old<pid>`,
    never a mixture. The caller decides whether replacing is allowed (refuse_existing_output)."""
    clean_stale_temporaries(path)
    tmp = temp_path(path)
    os.makedirs(tmp)
    try:
        yield tmp
        old = None
        if os.path.lexists(path):
            old = f"{path}.old{os.getpid()}"
            os.replace(path, old)
        os.replace(tmp, path)
        fsync_path(os.path.dirname(os.path.abspath(path)))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old) if os.path.isdir(old) and not os.path.islink(old) else os.remove(old)
