"""Have the learned positional kernels stopped drifting? Read off the run records' trajectories
(each head's positional parameters, logged every step by the trainer as {name}_h{i}).

The measure, per head and parameter: the relative change over the last `tail` of training,
|x(T) - x((1 - tail) T)| / |x(T)| (T the last logged step). A head whose value still moves by a
large fraction of itself in the last 20% of a decaying schedule had not found its kernel yet.
"""
from __future__ import annotations

import json
import os
from collections import defaultdict

import numpy as np

from megatron.positional.base import parse_head_key

DRIFT_TARGET = 0.05  # the reproduction's target: every head's parameters move by less than this over the tail


def head_series(trajectory: dict) -> dict[str, dict[int, list[float]]]:
    """{parameter name: {head: values}} from a trajectory's {name}_h{i} keys."""
    out: dict[str, dict[int, list[float]]] = defaultdict(dict)
    for key, values in trajectory.items():
        parsed = parse_head_key(key)
        if parsed:
            out[parsed[0]][parsed[1]] = values
    return dict(out)


def relative_tail_change(iterations: list[int], values: list[float], tail: float = 0.2) -> float:
    """|x(T) - x(t0)| / |x(T)| with t0 the last logged step at or before (1 - tail) * T."""
    if not 0 < tail < 1:
        raise ValueError(f"tail must be in (0, 1), got {tail}")
    it = np.asarray(iterations, dtype=float)
    x = np.asarray(values, dtype=float)
    start = int(np.searchsorted(it, (1 - tail) * it[-1], side="right")) - 1
    start = max(start, 0)
    return float(abs(x[-1] - x[start]) / max(abs(x[-1]), 1e-12))


def load_records(records_dir: str) -> list[dict]:
    """Every complete record under records_dir with its trajectory: [{**record.json, "trajectory": {...}}].
    train_length (written into record.json since reproduction v3) falls back to the record's eval.json;
    label (the report's name of the scheme) falls back to the scheme."""
    out = []
    for name in sorted(os.listdir(records_dir)):
        d = os.path.join(records_dir, name)
        meta, traj = os.path.join(d, "record.json"), os.path.join(d, "trajectory.json")
        if os.path.isfile(meta) and os.path.isfile(traj):
            with open(meta) as f, open(traj) as g:
                rec = {**json.load(f), "dir": d, "trajectory": json.load(g)}
            if rec.get("train_length") is None and os.path.isfile(os.path.join(d, "eval.json")):
                with open(os.path.join(d, "eval.json")) as f:
                    rec["train_length"] = json.load(f).get("train_length")
            rec.setdefault("label", rec["scheme"])
            out.append(rec)
    return out


def over_target(record: dict, tail: float = 0.2) -> dict[str, dict[int, float]]:
    """{parameter: {head: relative tail change}} of one record's heads that moved more than DRIFT_TARGET."""
    traj = record["trajectory"]
    out = {}
    for name, heads in head_series(traj).items():
        moved = {h: relative_tail_change(traj["iteration"], v, tail) for h, v in heads.items()}
        out[name] = {h: x for h, x in moved.items() if x > DRIFT_TARGET}
    return out


def records_to_draw(records: list[dict]) -> list[dict]:
    """The records of one group whose trajectories the report draws: the lowest seed of each scheme
    (label), then every other record with a head over DRIFT_TARGET (the exceptions drift.md counts)."""
    ordered = sorted(records, key=lambda r: (r["label"], str(r["seed"])))
    first = {}
    for rec in ordered:
        first.setdefault(rec["label"], rec)
    lowest = list(first.values())
    return lowest + [r for r in ordered if r not in lowest and any(over_target(r).values())]


def drift_rows(records: list[dict], tail: float = 0.2) -> list[dict]:
    """One row per (dataset, train length, scheme, parameter) over all seeds and heads of the records
    that learn per-head parameters: median and max relative change over the tail, and the count."""
    groups: dict[tuple, list[float]] = defaultdict(list)
    for rec in records:
        traj = rec["trajectory"]
        for name, heads in head_series(traj).items():
            for values in heads.values():
                key = (rec["dataset"], rec.get("train_length") or 0, rec.get("label") or rec["scheme"], name)
                groups[key].append(relative_tail_change(traj["iteration"], values, tail))
    return [{"dataset": d, "train_length": L or None, "scheme": s, "parameter": p, "median": float(np.median(v)),
             "max": float(np.max(v)), "heads": len(v), "over_target": sum(x > DRIFT_TARGET for x in v)}
            for (d, L, s, p), v in sorted(groups.items())]


def drift_markdown(rows: list[dict], tail: float = 0.2) -> str:
    pct = round(tail * 100)
    lines = [f"| dataset | train length | scheme | parameter | median change, last {pct}% | max change, last {pct}% "
             f"| heads x seeds | over {DRIFT_TARGET:.0%} |", "|---|---:|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['dataset']} | {r['train_length'] or '–'} | {r['scheme']} | {r['parameter']} "
                     f"| {r['median']:.1%} | {r['max']:.1%} | {r['heads']} | {r['over_target']} |")
    return "\n".join(lines) + (f"\n\nRelative change |x(T) - x({1 - tail:g}T)| / |x(T)| of each head's parameter "
                               "over the last part of training (T = the last step), from the run records' "
                               "per-step trajectories.\n")
