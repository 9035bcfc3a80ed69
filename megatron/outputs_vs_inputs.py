"""Inputs are sacred: the one rule, for every entry point, on where an output may go.

A tool never writes into, and with --overwrite never deletes, one of its own inputs (a checkpoint
directory, an HF model, data files, another run's checkpoints):
- an output is never an input itself, nor inside an input directory (writing there changes what
  the next reader of that input sees: a new step in another run's checkpoints, a .bin among the
  documents a directory of jsonl files is read from);
- an output that is replaced whole (`replaced_whole`: a merged, converted, imported or exported
  directory, atomic_io.atomic_directory) never holds an input either: --overwrite would delete it.
- several inputs never share one output (`refuse_shared_outputs`): the second's results would
  replace the first's.
Paths are compared after os.path.realpath, so a symlink (or `..`) to an input is that input, and
existing files also by inode (a hard link is the same file). Checked before anything is read or
written; no torch here, so the refusal comes at once.
"""
from __future__ import annotations

import os
from collections.abc import Iterable

from megatron.errors import UserError


class OutputOverlapsInput(UserError):
    """An output that is, lies inside, or (replaced whole) holds one of the tool's inputs."""


def _inside(path: str, directory: str) -> bool:
    """`path` strictly below `directory` (both real paths)."""
    return path != directory and path.startswith(directory.rstrip(os.sep) + os.sep)


def _same(a: str, b: str) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)  # a hard link to the input is the input
    except OSError:  # one of them does not exist yet
        return False


def _where(path: str) -> str:
    """The path as given, and where it really is when a symlink or `..` leads elsewhere."""
    real = os.path.realpath(path)
    return path if real == os.path.abspath(path) else f"{path} (really {real})"


def overlap(output: str, input_path: str, replaced_whole: bool = False) -> str | None:
    """How `output` overlaps `input_path` ('is', 'lies inside', 'holds'), or None when it does not.
    A path that does not exist (yet) is compared by where it would be."""
    out, src = os.path.realpath(output), os.path.realpath(input_path)
    if _same(output, input_path):
        return "is"
    if os.path.isdir(src) and _inside(out, src):
        return "lies inside"
    if replaced_whole and _inside(src, out):
        return "holds"
    return None


def refuse_overlap(flag: str, output: str, inputs: Iterable[tuple[str, str]], replaced_whole: bool = False,
                   fix: str | None = None) -> None:
    """OutputOverlapsInput unless `output` (given with `flag`, e.g. '--out') stays clear of every
    input. inputs: (what, path) pairs, what naming the input as the user gave it, e.g.
    ('the checkpoint being read (--checkpoint)', ckpt). Empty or unset paths are skipped.
    fix: what to do instead (default: choose another `flag` outside the input)."""
    for what, path in inputs:
        if not path or not output:
            continue
        how = overlap(output, path, replaced_whole)
        if how is None:
            continue
        harm = {"is": "it would be overwritten" + (" (deleted first, with --overwrite)" if replaced_whole else ""),
                "lies inside": "the output would be written into it",
                "holds": "replacing the output (--overwrite) would delete it"}[how]
        raise OutputOverlapsInput(
            f"{flag} {_where(output)} {how} {what}, {_where(path)}: {harm}. An output never goes into, or "
            f"replaces, one of the inputs it is made from; nothing was read, written or deleted: "
            + (fix or f"choose a {flag} outside {path}"))


def refuse_shared_outputs(flag: str, outputs: Iterable[tuple[str, str]]) -> None:
    """OutputOverlapsInput when two inputs would write the same output: outputs are (input, output)
    pairs. The same input given twice is named as such (one run would redo, and replace, the other)."""
    seen: dict[str, str] = {}
    for src, out in outputs:
        key = os.path.realpath(out)
        if key not in seen:
            seen[key] = src
            continue
        first = seen[key]
        if _same(first, src):
            raise OutputOverlapsInput(f"{src} is given twice (as {first} and {src}): its second result would replace "
                                      "its first; give each input once")
        raise OutputOverlapsInput(f"{first} and {src} would both write their results to {flag} {out}: the second "
                                  f"would replace the first's; give them different {flag} directories (run them "
                                  "one at a time)")
