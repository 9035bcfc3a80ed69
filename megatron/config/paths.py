"""Where a run writes: every output path a user does not set derives from `run-dir`.

    run-dir          given, else `save` if given (NeoX configs), else runs/<first config's name>
    save             given, else <run-dir>/checkpoints when a save interval is set (else never)
    load             given, else the derived save (re-running resumes this run; load = save)
    tensorboard-dir  given, else <run-dir>/tensorboard
    log-dir          given, else <run-dir>/logs

So `-o run-dir=runs/x` moves everything, and never resumes from another run's checkpoints. A key
given as null stays null (no save, no load, no TensorBoard). A key that is given keeps its value
(NeoX semantics: relative to the current directory); when save or load is outside run-dir the
launcher says so in one line (`outside_run_dir`).
"""
from __future__ import annotations

import dataclasses
import os
import re

from megatron.config.originals import RESOLVED_NAME
from megatron.config.schema import canonical

# A checkpoint directory's names (megatron/checkpoint/tags.py reads and writes them): `latest`
# holds the tag of the newest step, and a step's directory is its tag. Spelled here, below both the
# config's input checks and the checkpoint code, which use them.
LATEST = "latest"
TAG_PREFIX = "global_step"
_STEP_TAG = re.compile(re.escape(TAG_PREFIX) + r"(\d+)")


def tag_for(iteration: int) -> str:
    """The tag (step directory name) of `iteration`: the only place `global_step<N>` is spelled."""
    return f"{TAG_PREFIX}{iteration}"


def step_of(tag: str) -> int | None:
    """N for a `global_step<N>` tag; None for any other name."""
    m = _STEP_TAG.fullmatch(tag)
    return int(m.group(1)) if m else None


# What each derived path is, relative to run-dir (the rule above).
DERIVED_UNDER_RUN_DIR = {"tensorboard_dir": "tensorboard", "log_dir": "logs", "save": "checkpoints",
                         "load": "checkpoints"}


def given_keys(cfg) -> set[str]:
    """The flat keys some file, override or replace() set (null included).

    A resolved_config.yml (this stack's own output: a run's, a checkpoint's, an import's) states
    every derived path explicitly. Stacked under a new run's files (the fine-tuning recipe: the
    imported model's resolved_config.yml, then a file with its own run-dir), those paths were not
    anybody's choice: a path that is its file's own run-dir's derivation counts as not given and
    follows the new run-dir (else TensorBoard went to the imported run's directory)."""
    run_dir_of = {e.origin: e.value for e in cfg._sources
                  if canonical(e.key) == "run_dir" and os.path.basename(str(e.origin)) == RESOLVED_NAME}
    out = set()
    for e in cfg._sources:
        key, base = canonical(e.key), run_dir_of.get(e.origin)
        if (base is not None and key in DERIVED_UNDER_RUN_DIR and isinstance(e.value, str)
                and os.path.normpath(e.value) == os.path.normpath(os.path.join(base, DERIVED_UNDER_RUN_DIR[key]))):
            continue
        out.add(key)
    return out


def derive_paths(cfg, run_name: str):
    """cfg with the paths above filled in (the resolved config then states them explicitly)."""
    given = given_keys(cfg)
    log, ck = cfg.logging, cfg.checkpoint
    run_dir = log.run_dir
    if run_dir is None:
        run_dir = ck.save or os.path.join("runs", run_name)
    save, load = ck.save, ck.load
    if "save" not in given and ck.interval is not None:
        save = os.path.join(run_dir, "checkpoints")
        if "load" not in given:
            load = save
    tensorboard = log.tensorboard_dir if "tensorboard_dir" in given else os.path.join(run_dir, "tensorboard")
    log_dir = log.log_dir if "log_dir" in given else os.path.join(run_dir, "logs")
    return dataclasses.replace(
        cfg,
        logging=dataclasses.replace(log, run_dir=run_dir, tensorboard_dir=tensorboard, log_dir=log_dir),
        checkpoint=dataclasses.replace(ck, save=save, load=load))


def _inside(path: str, directory: str) -> bool:
    path, directory = os.path.realpath(path), os.path.realpath(directory)
    return path == directory or path.startswith(directory + os.sep)


def outside_run_dir(cfg) -> str | None:
    """One line when a path the run writes or reads (save, load, tensorboard-dir, log-dir) is not
    under run-dir (a run that resumes, or writes elsewhere)."""
    run_dir, log, ck = cfg.logging.run_dir, cfg.logging, cfg.checkpoint
    away = [f"{name} {path}" for name, path in (("save", ck.save), ("load", ck.load),
                                                ("tensorboard-dir", log.tensorboard_dir), ("log-dir", log.log_dir))
            if path and not _inside(path, run_dir)]
    if not away:
        return None
    return f"note: {' and '.join(away)} {'is' if len(away) == 1 else 'are'} outside run-dir {run_dir} (set in the config)"


def saves_nothing(cfg) -> str | None:
    """One line when a save interval is set but no save directory (a resolved config stacked under
    another carries an explicit `save: null`, which run-dir does not replace): such a run trains to
    the end and keeps no checkpoint, which nobody setting an interval means."""
    ck = cfg.checkpoint
    if ck.interval is None or ck.save:
        return None
    return (f"note: save-interval {ck.interval} is set but no save directory is (save: null), so this run keeps "
            "no checkpoint; set `save:` (e.g. <run-dir>/checkpoints) to keep them")


def unused_data_path(cfg) -> str | None:
    """One line when data-path is set but train-data-paths take precedence (NeoX's rule)."""
    d = cfg.data
    if d.data_path and d.train_data_paths:
        return (f"note: data-path {d.data_path} is not used: train-data-paths are set and take precedence, as in "
                "NeoX (valid/test data come from valid-data-paths / test-data-paths)")
    return None
