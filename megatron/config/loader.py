"""Reading a configuration: YAML files + overrides -> the entries NeoXConfig.build assembles.

The loader only reads; it knows nothing of sections or NeoXConfig (megatron/config/neox.py
builds itself from these entries), so the two do not import each other.
"""
from __future__ import annotations

import os

from megatron.config.errors import Problem
from megatron.config.sources import Entry, read_files

OVERRIDE_ORIGIN = "-o on the command line"  # where an override's problem is said to come from


def read_entries(paths=(), overrides: dict | None = None) -> tuple[list[Entry], dict[str, str], str, list[Problem]]:
    """(entries, {basename: text}, run name, problems reading the files).

    Entries keep file order, then `overrides` (same flat keys); later ones win when merged.
    The run name is the first file's name without extension ("default" with no file).
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = list(paths)
    entries, texts, problems = read_files(paths)
    entries += [Entry(k, v, OVERRIDE_ORIGIN) for k, v in (overrides or {}).items()]
    run_name = os.path.splitext(os.path.basename(os.fspath(paths[0])))[0] if paths else "default"
    return entries, texts, run_name, problems
