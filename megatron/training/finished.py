"""A run started again after it finished: one rule for the trainer and for deepy.py's launch and
dry run, and what the new config would change in the run's record.

A run is finished when the checkpoint it loads is at `train-iters` and its end-of-training evaluation
(the test row, or the validation row where there is no test data) is in metrics.jsonl. A run killed
after its last save, before that evaluation, is not finished: it evaluates when started again.

Starting a finished run does nothing and writes nothing: its resolved_config.yml, configs/ and
TensorBoard events stay as they were, so the run directory keeps saying how its checkpoint was
trained. Overrides that differ from that record (`-o lr=3e-4` on a finished run) are named, with
their recorded and new values, by the dry run, the launch and the trainer alike.

Torch-free: deepy.py's dry run and its refusals import it before torch loads.
"""
from __future__ import annotations

import os

import yaml

from megatron.checkpoint.tags import read_latest
from megatron.config.originals import RESOLVED_NAME
from megatron.config.paths import step_of
from megatron.config.schema import hyphen
from megatron.config.untrusted_yaml import LimitedSafeLoader, read_bounded
from megatron.process.metrics_file import metrics_path, read_metrics


def expects_test_rows(cfg) -> bool:
    """Whether training ends with a test evaluation: test data (a test prefix, or one data-path that
    the split divides) and eval-iters > 0, as data_setup.build_datasets builds the test split."""
    d = cfg.data
    return cfg.training.eval_iters > 0 and bool(d.single_path or d.test_data_paths)


def is_finished(cfg, run_dir: str, iteration: int, expects_test: bool) -> bool:
    """The rule: a run whose checkpoint at `iteration` was loaded is finished (see the module)."""
    t, c = cfg.training, cfg.checkpoint
    if t.train_iters == 0 or iteration < t.train_iters or c.finetune:
        return False
    path = metrics_path(run_dir)
    rows = read_metrics(path) if os.path.isfile(path) else []
    last = "test" if expects_test else "validation"
    return any(r.get("kind") == last and r.get("iteration") == iteration for r in rows)


def finished_iteration(cfg) -> int | None:
    """The iteration of the finished run this config would start again, read from the files (the
    checkpoint `latest` names in `load`, metrics.jsonl) before anything is built; None otherwise."""
    load = cfg.checkpoint.load
    if not load or not os.path.isdir(load):
        return None
    try:
        tag = read_latest(load)
    except Exception:  # a damaged `latest` is the checkpoint checks' to name, not this note's
        return None
    iteration = step_of(tag) if tag else None
    if iteration is None:
        return None
    return iteration if is_finished(cfg, cfg.logging.run_dir, iteration, expects_test_rows(cfg)) else None


def recorded_changes(cfg) -> list[tuple[str, object, object]]:
    """(key, recorded value, new value) for each key of the run's resolved_config.yml that this
    config sets otherwise, in key order; [] when there is no readable record."""
    path = os.path.join(cfg.logging.run_dir, RESOLVED_NAME)
    try:
        recorded = yaml.load(read_bounded(path, f"recorded config {path}"), Loader=LimitedSafeLoader)
    except Exception:  # no record, or one damaged: nothing to compare with (the run's loader names damage)
        return []
    if not isinstance(recorded, dict):
        return []
    old, new = _leaves(recorded), _leaves(cfg.to_flat_dict())
    return [(key, old[key], new[key]) for key in sorted(new) if key in old and not _same(old[key], new[key])]


def _leaves(flat: dict, prefix: str = "") -> dict:
    """{dotted key: value} down to the leaves of nested mappings (NeoX's `optimizer.params.lr`)."""
    out = {}
    for key, value in flat.items():
        name = f"{prefix}{hyphen(str(key))}"
        if isinstance(value, dict) and value:
            out.update(_leaves(value, f"{name}."))
        else:
            out[name] = value
    return out


def _shown(value) -> str:
    """A value as the user wrote it: numbers bare (also a number YAML 1.1 kept as a string), text quoted."""
    try:
        float(value)
        return str(value)
    except (TypeError, ValueError):
        return repr(value)


def _same(a, b) -> bool:
    """Equal values, numbers by value (an override's `3e-4` may stay a string where YAML 1.1 reads it so)."""
    if a == b:
        return True
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return False


def finished_note(cfg, iteration: int, changes: list[tuple[str, object, object]]) -> str:
    """What a start of a finished run says (the trainer and deepy.py say the same)."""
    note = (f"this run already finished: its checkpoint is at iteration {iteration} = train-iters and its final "
            f"evaluation is in {metrics_path(cfg.logging.run_dir)}; nothing to do, and nothing in "
            f"{cfg.logging.run_dir} is changed. Raise train-iters to train further, or evaluate the checkpoint "
            "with evaluate.py")
    if changes:
        listed = ", ".join(f"{key} {_shown(old)} -> {_shown(new)}" for key, old, new in changes)
        note += (f". WARNING: this config differs from the one the run was trained with ({listed}); the run's "
                 f"{RESOLVED_NAME} keeps the values its checkpoint was trained with, and these take effect only "
                 "for steps past train-iters")
    return note
