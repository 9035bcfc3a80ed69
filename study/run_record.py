"""A finished matrix run reduced to the small files a report needs, so a results directory can be
committed and a matrix finished over several sessions or machines (checkpoints stay behind).

<records>/<run name>/
    eval.json            evaluate.py's sweep (copied)
    eval_window.json     the windowed evaluation, when the run had one (copied)
    trajectory.json      every `every`-th training step's lm_loss, learning rate and each head's
                         positional parameter values ({name}_h{i}, the trainer's per-head stats)
    kernel.json          the learned kernel f_h(d), d = 0..max_distance, when the scheme has a score
                         bias ("by_query" too for a query-dependent one, FIRE); written from the checkpoint
    record.json          what the run was (scheme, dataset, seed, train length, config files, steps), its
                         seconds and where it trained ("trained_on": each device and the step from which it
                         ran, from the trainer's start rows: a seed retrained on another thread count or
                         GPU differs, so a rerun that does not match can be told apart); a matrix run
                         with a report label (study/experiments.py) has it here and in its two
                         evaluation files ("label"), which the report reads as the scheme

A record is complete when record.json exists: it is written last, after the other files.
"""
from __future__ import annotations

import json
import os
import shutil

from megatron.atomic_io import atomic_output
from megatron.evaluation.kernels import learned_kernels
from megatron.positional.base import parse_head_key
from megatron.process.metrics_file import read_metrics

RECORD = "record.json"
TRAJECTORY_KEYS = ("lm_loss", "learning_rate")


def record_complete(record_dir: str) -> bool:
    return os.path.isfile(os.path.join(record_dir, RECORD))


def trajectory_from_metrics(metrics_path: str, every: int = 10) -> dict:
    """{"iteration": [...], key: [...]} for every `every`-th training row (and the last one):
    lm_loss, learning_rate and every per-head positional value (keys ending in _h<digits>)."""
    rows = [r for r in read_metrics(metrics_path) if r.get("kind", "train") == "train" and "iteration" in r]
    if not rows:
        raise ValueError(f"{metrics_path}: no training rows; was the run trained?")
    last = rows[-1]["iteration"]
    rows = [r for r in rows if r["iteration"] % every == 0 or r["iteration"] == last]
    keys = [k for k in rows[-1] if k in TRAJECTORY_KEYS or parse_head_key(k)]
    out = {"iteration": [int(r["iteration"]) for r in rows]}
    for k in keys:  # 6 significant digits: the record is committed, full floats would double its size
        out[k] = [None if r.get(k) is None else float(f"{r[k]:.6g}") for r in rows]
    return out


def training_devices(metrics_path: str) -> list[dict]:
    """[{"from_step", "device", "processes", "torch"}] from the trainer's `start` rows, one entry per change
    (a resume on the same device adds none); [] for a run trained before they were logged."""
    out = []
    for r in read_metrics(metrics_path):
        if r.get("kind") != "start":
            continue
        entry = {"from_step": int(r["iteration"]), **{k: r.get(k) for k in ("device", "processes", "torch")}}
        if not out or any(out[-1][k] != entry[k] for k in ("device", "processes", "torch")):
            out.append(entry)
    return out


def kernel_record(checkpoint_dir: str, max_distance: int) -> dict | None:
    """The learned kernel as JSON-ready lists (5 significant digits), or None without a score bias."""
    out = learned_kernels(checkpoint_dir, max_distance)
    if out is None:
        return None
    rec = {"scheme": out["scheme"], "iteration": out["iteration"], "max_distance": max_distance,
           "kernel": _rounded(out["kernel"])}
    if "by_query" in out:
        rec["by_query"] = {str(i): _rounded(k) for i, k in out["by_query"].items()}
    return rec


def _rounded(array) -> list:
    return [[float(f"{v:.5g}") for v in row] for row in array.tolist()]


def write_record(record_dir: str, run, eval_dir: str, window_dir: str | None, metrics_path: str,
                 max_distance: int, seconds: float, every: int = 10) -> str:
    """Write the record of one finished run (see the module docstring); returns record_dir."""
    os.makedirs(record_dir, exist_ok=True)
    label = getattr(run, "label", None)
    train_length = _copy_eval(os.path.join(eval_dir, "eval.json"), os.path.join(record_dir, "eval.json"), label)
    if window_dir:
        _copy_eval(os.path.join(window_dir, "eval.json"), os.path.join(record_dir, "eval_window.json"), label)
    trajectory = trajectory_from_metrics(metrics_path, every)
    _write_json(os.path.join(record_dir, "trajectory.json"), trajectory)
    kernel = kernel_record(run.checkpoints, max_distance)
    if kernel is not None:
        _write_json(os.path.join(record_dir, "kernel.json"), kernel)
    meta = {"name": run.name, "scheme": run.scheme, "dataset": run.dataset, "seed": run.seed,
            "train_length": train_length, "config": run.config, "steps": trajectory["iteration"][-1],
            "seconds": round(seconds, 1)}
    if label:
        meta["label"] = label
    devices = training_devices(metrics_path)
    if devices:
        meta["trained_on"] = devices
    _write_json(os.path.join(record_dir, RECORD), meta)  # last: marks the record complete
    return record_dir


def _copy_eval(src: str, dst: str, label: str | None) -> int | None:
    """Copy an evaluation file (adding the run's label when it has one); returns its train length."""
    with open(src) as f:
        blob = json.load(f)
    if label:
        blob["label"] = label
        _write_json(dst, blob)
    else:
        with atomic_output(dst) as tmp:
            shutil.copyfile(src, tmp)
    return blob.get("train_length")


def _write_json(path: str, blob) -> None:
    with atomic_output(path) as tmp, open(tmp, "w") as f:
        f.write(json.dumps(blob, separators=(",", ":")) + "\n")
