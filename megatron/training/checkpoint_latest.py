"""The `latest` file of a checkpoint directory: the one place that reads, validates and writes it.

`latest` holds the tag of the newest complete checkpoint, the name of a directory next to it
(`global_step<N>`). A tag is only ever a plain name inside the checkpoint directory: one holding
`../../elsewhere/global_step40`, an absolute path or any path separator is refused, so a crafted
`latest` (or tag argument) cannot make a loader read files outside the directory it was given.

Writers replace `latest` atomically through `latest.tmp<pid>`; a writer killed in between leaves
that file behind, and the next writer (or the next training start) removes it unless the process
that wrote it is still running.
"""
from __future__ import annotations

import os
import re

from megatron.atomic_io import atomic_output, fsync_path

LATEST = "latest"
TMP_PREFIX = LATEST + ".tmp"
_TMP = re.compile(re.escape(TMP_PREFIX) + r"(\d+)")


def _error(message: str):
    from megatron.training.checkpoint import CheckpointError  # checkpoint.py imports this module

    return CheckpointError(message)


def tag_for(iteration: int) -> str:
    return f"global_step{iteration}"


def is_plain_tag(tag: str) -> bool:
    """A single directory name: no separator, not '.'/'..', not absolute, no NUL."""
    return (bool(tag) and tag not in (".", "..") and "\x00" not in tag
            and not any(sep in tag for sep in ("/", "\\", os.sep)) and not os.path.isabs(tag))


def check_tag(tag: str, ckpt_dir: str, source: str) -> str:
    """`tag` when it is a plain name; otherwise a CheckpointError naming `source` (the `latest`
    file, or the argument it came from) and the fix."""
    if not is_plain_tag(tag):
        raise _error(
            f"{source} names checkpoint {tag!r}, which is not the plain name of a step directory inside "
            f"{ckpt_dir} (a path with '/', '..' or an absolute path would read files outside the checkpoint "
            "directory, so it is refused); write the name of one of its global_step<N> directories there "
            "(e.g. global_step40), or name a step with --iteration / `iteration:`")
    return tag


def read_latest(ckpt_dir: str) -> str | None:
    """The validated tag `latest` names, or None when there is no `latest` file."""
    path = os.path.join(ckpt_dir, LATEST)
    try:
        with open(path) as f:
            tag = f.read().strip()
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as e:
        raise _error(f"{path} is not a text file holding a checkpoint tag ({e}); write the name of a "
                     "global_step<N> directory into it, or name a step with --iteration / `iteration:`") from e
    if not tag:
        raise _error(f"{path} is empty; write the name of a global_step<N> directory into it, or name a step "
                     "with --iteration / `iteration:`")
    check_tag(tag, ckpt_dir, path)
    if not os.path.isdir(os.path.join(ckpt_dir, tag)):
        raise _error(f"{path} names checkpoint {tag!r}, but {os.path.join(ckpt_dir, tag)} does not exist; "
                     "fix `latest` to name an existing global_step directory, or name a step with "
                     "--iteration / `iteration:`")
    return tag


def resolve_tag(ckpt_dir: str, tag: str | None = None) -> str:
    """`tag` (validated), else the one `latest` names; a clear error when neither exists."""
    if not os.path.isdir(ckpt_dir):
        raise _error(f"checkpoint directory {ckpt_dir!r} does not exist")
    if tag is not None:
        return check_tag(tag, ckpt_dir, "--iteration / the requested tag")
    found = read_latest(ckpt_dir)
    if found is None:
        raise _error(f"{ckpt_dir!r} has no `latest` file; pass the checkpoint directory that holds `latest` "
                     "and global_step<N>/, or name a step with --iteration")
    return found


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def clean_stale_tmp(ckpt_dir: str) -> list[str]:
    """Remove `latest.tmp<pid>` files whose writer is gone (or is this process, which is not
    writing now); returns the removed paths. A live writer's file is left alone."""
    removed = []
    try:
        names = os.listdir(ckpt_dir)
    except FileNotFoundError:
        return removed
    for name in names:
        m = _TMP.fullmatch(name)
        if m is None:
            continue
        pid = int(m.group(1))
        if pid != os.getpid() and _process_alive(pid):
            continue
        try:
            os.remove(os.path.join(ckpt_dir, name))
            removed.append(os.path.join(ckpt_dir, name))
        except FileNotFoundError:  # its writer finished meanwhile
            pass
    return removed


def write_latest(ckpt_dir: str, tag: str) -> None:
    """Point `latest` at `tag` atomically (temp file, fsync, rename, fsync of the directory)."""
    check_tag(tag, ckpt_dir, "the tag being saved")
    clean_stale_tmp(ckpt_dir)
    with atomic_output(os.path.join(ckpt_dir, LATEST)) as tmp, open(tmp, "w") as f:  # latest.tmp<pid>
        f.write(tag)
    fsync_path(ckpt_dir)
