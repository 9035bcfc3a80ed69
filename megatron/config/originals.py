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

from megatron.atomic_io import process_alive
from megatron.config.untrusted_yaml import read_bounded

RESOLVED_NAME = "resolved_config.yml"
ORIGINALS_DIR = "configs"
# deepy.py writes a launch's resolved config and originals under <run-dir>/.launch-<pid>/ first;
# the training process moves them into place once its checks have passed (publish_staged). A
# refused launch (a resume whose model changed, a locked run) leaves the run's own files as they
# were, and deepy.py removes the staging directory (discard_staged).
STAGING_PREFIX = ".launch-"


def staged_resolved_path(run_dir: str) -> str:
    return os.path.join(run_dir, f"{STAGING_PREFIX}{os.getpid()}", RESOLVED_NAME)


def publish_staged(resolved_path: str | None) -> bool:
    """Move a staged resolved_config.yml and its configs/ into the run directory (the staging
    directory's parent); False when `resolved_path` is not staged (a config given directly)."""
    if not resolved_path:
        return False
    staging = os.path.dirname(os.path.abspath(resolved_path))
    if not os.path.basename(staging).startswith(STAGING_PREFIX) or not os.path.isfile(resolved_path):
        return False
    run_dir = os.path.dirname(staging)
    originals = os.path.join(staging, ORIGINALS_DIR)
    if os.path.isdir(originals):
        final = os.path.join(run_dir, ORIGINALS_DIR)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(originals, final)
    os.replace(resolved_path, os.path.join(run_dir, RESOLVED_NAME))
    shutil.rmtree(staging, ignore_errors=True)
    return True


def discard_stale_staging(run_dir: str) -> list[str]:
    """Remove the staging directories (`.launch-<pid>/`) of launchers that are gone: one killed
    between staging and publishing would otherwise leave its directory in the run for good. A live
    launcher's is left alone (this host's pids; deepy.py calls this before it stages its own)."""
    removed = []
    for path in sorted(glob.glob(os.path.join(glob.escape(run_dir), STAGING_PREFIX + "*"))):
        pid = os.path.basename(path)[len(STAGING_PREFIX):]
        if os.path.isdir(path) and pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def discard_staged(resolved_path: str) -> bool:
    """Remove what publish_staged did not move (the launch was refused); True when there was any."""
    staging = os.path.dirname(os.path.abspath(resolved_path))
    if not os.path.basename(staging).startswith(STAGING_PREFIX) or not os.path.isdir(staging):
        return False
    shutil.rmtree(staging, ignore_errors=True)
    return True


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
