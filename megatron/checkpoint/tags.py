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

from megatron.atomic_io import atomic_output, clean_stale_temporaries, fsync_path
from megatron.checkpoint.errors import CheckpointError
from megatron.config.paths import LATEST, step_of, tag_for
from megatron.errors import UserError


def tag_or_latest(iteration: int | None) -> str | None:
    """tag_for(iteration), or None (= the step `latest` names) for the CLIs' unset --iteration."""
    return None if iteration is None else tag_for(iteration)


def tag_dir_of(ckpt_dir: str, tag: str | None = None) -> str:
    """The step directory named by `tag` or by `latest` (a plain name inside ckpt_dir); clear
    errors when either is missing or invalid."""
    path = os.path.join(ckpt_dir, resolve_tag(ckpt_dir, tag))
    if not os.path.isdir(path):
        raise CheckpointError(f"{path} does not exist: `latest` (or --iteration) names a missing step; "
                              "fix `latest` or pass --iteration of an existing global_step directory")
    return path


def is_plain_tag(tag: str) -> bool:
    """A single directory name: no separator, not '.'/'..', not absolute, no NUL."""
    return (bool(tag) and tag not in (".", "..") and "\x00" not in tag
            and not any(sep in tag for sep in ("/", "\\", os.sep)) and not os.path.isabs(tag))


def check_tag(tag: str, ckpt_dir: str, source: str) -> str:
    """`tag` when it is a plain name; otherwise a CheckpointError naming `source` (the `latest`
    file, or the argument it came from) and the fix."""
    if not is_plain_tag(tag):
        raise CheckpointError(
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
        raise CheckpointError(f"{path} is not a text file holding a checkpoint tag ({e}); write the name of a "
                     "global_step<N> directory into it, or name a step with --iteration / `iteration:`") from e
    if not tag:
        raise CheckpointError(f"{path} is empty; write the name of a global_step<N> directory into it, or name a step "
                     "with --iteration / `iteration:`")
    check_tag(tag, ckpt_dir, path)
    if not os.path.isdir(os.path.join(ckpt_dir, tag)):
        raise CheckpointError(f"{path} names checkpoint {tag!r}, but {os.path.join(ckpt_dir, tag)} does not exist; "
                     "fix `latest` to name an existing global_step directory, or name a step with "
                     "--iteration / `iteration:`")
    return tag


def resolve_tag(ckpt_dir: str, tag: str | None = None) -> str:
    """`tag` (validated), else the one `latest` names; a clear error when neither exists."""
    if not os.path.isdir(ckpt_dir):
        raise CheckpointError(f"checkpoint directory {ckpt_dir!r} does not exist")
    if tag is not None:
        return check_tag(tag, ckpt_dir, "--iteration / the requested tag")
    found = read_latest(ckpt_dir)
    if found is None:
        steps = steps_in(ckpt_dir)
        if steps:
            raise CheckpointError(f"{missing_latest(ckpt_dir, steps)}; name the step to read with --iteration "
                                  f"(e.g. --iteration {steps[-1]})")
        raise CheckpointError(f"{ckpt_dir!r} has no `latest` file; pass the checkpoint directory that holds `latest` "
                     "and global_step<N>/, or name a step with --iteration")
    return found


def steps_in(ckpt_dir: str) -> list[int]:
    """The steps of the complete global_step<N> directories in ckpt_dir, in order (a save still
    being written is `global_step<N>.incomplete`, not a step)."""
    try:
        names = os.listdir(ckpt_dir)
    except FileNotFoundError:
        return []
    return sorted(n for d in names if (n := step_of(d)) is not None and os.path.isdir(os.path.join(ckpt_dir, d)))


def describe_steps(steps: list[int], shown: int = 6) -> str:
    """'global_step2, global_step4' (the last `shown` of many, with a count)."""
    names = ", ".join(tag_for(s) for s in steps[-shown:])
    return names if len(steps) <= shown else f"{len(steps)} steps, up to ... {names}"


def missing_latest(ckpt_dir: str, steps: list[int]) -> str:
    """The first half of every refusal of a directory with steps but no `latest`."""
    path = os.path.join(ckpt_dir, LATEST)
    return (f"checkpoint directory {ckpt_dir!r} holds checkpoints {describe_steps(steps)} but has no `latest` file "
            f"(deleted, or not synced yet), so which step to read is unknown; to use the newest, write its name "
            f"into {path} (echo {tag_for(steps[-1])} > {path})")


def clean_stale_tmp(ckpt_dir: str) -> list[str]:
    """Remove `latest.tmp<pid>` files whose writer is gone (megatron/atomic_io.py); returns the
    removed paths (in the directory as given)."""
    removed = clean_stale_temporaries(os.path.join(ckpt_dir, LATEST))
    return [os.path.join(ckpt_dir, os.path.basename(p)) for p in removed]


def write_latest(ckpt_dir: str, tag: str) -> None:
    """Point `latest` at `tag` atomically (temp file, fsync, rename, fsync of the directory)."""
    check_tag(tag, ckpt_dir, "the tag being saved")
    clean_stale_tmp(ckpt_dir)
    with atomic_output(os.path.join(ckpt_dir, LATEST)) as tmp, open(tmp, "w") as f:  # latest.tmp<pid>
        f.write(tag)
    fsync_path(ckpt_dir)


def latest_and_resume(save: str | None) -> str:
    """What a run that stopped keeps, and how to go on: for the last line of a stopped run."""
    if not save:
        return "nothing was saved (no `save` directory): the run starts over when run again"
    try:
        tag = read_latest(save)
    except UserError as e:
        return f"{save}/latest is unreadable ({e})"
    if tag is None:
        return f"no checkpoint in {save} yet: the same command starts the run over"
    return f"{save}/latest names {tag}: run the same command again to resume from it"
