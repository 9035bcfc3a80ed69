"""The user's original config files, kept beside the resolved config that was built from them.

NeoX stores the original YAML files in every checkpoint (`global_stepN/configs/`). Training
launched through deepy.py reads only `<run-dir>/resolved_config.yml`, so the originals would be
lost; deepy.py therefore writes them to `<run-dir>/configs/`, and loading a file named
`resolved_config.yml` picks up the `configs/` directory beside it as `cfg.config_files`. The same
layout holds inside a checkpoint (global_stepN/resolved_config.yml + global_stepN/configs/), so a
config read back from a checkpoint carries its originals too.
"""
from __future__ import annotations

import glob
import os
import shutil

from megatron.config.untrusted_yaml import read_bounded

RESOLVED_NAME = "resolved_config.yml"
ORIGINALS_DIR = "configs"


def write_originals(config_files: dict[str, str], run_dir: str) -> str:
    """Replace <run_dir>/configs/ with this launch's files (a stale file from an earlier launch
    with other files would claim to be part of this run). Returns the directory."""
    final = os.path.join(run_dir, ORIGINALS_DIR)
    staging = f"{final}.tmp{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    for name, text in config_files.items():
        with open(os.path.join(staging, name), "w", encoding="utf-8") as f:
            f.write(text)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(staging, final)
    return final


def read_originals(resolved_path) -> dict[str, str] | None:
    """{basename: text} of the configs/ beside a resolved_config.yml, or None if there is none."""
    resolved_path = os.fspath(resolved_path)
    if os.path.basename(resolved_path) != RESOLVED_NAME:
        return None
    folder = os.path.join(os.path.dirname(resolved_path), ORIGINALS_DIR)
    files = sorted(glob.glob(os.path.join(folder, "*.yml")) + glob.glob(os.path.join(folder, "*.yaml")))
    if not files:
        return None
    out = {}
    for path in files:  # carried into the next checkpoint: bounded as any config file
        out[os.path.basename(path)] = read_bounded(path, f"config file {path}").decode("utf-8", errors="replace")
    return out
