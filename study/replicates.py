"""Which runs trained the same thing? Two designs can share a configuration: the equal-sequence
trend at L = 64 (16 sequences of 64 tokens, warmup 10%) is the equal-token trend's L = 64, run
again under another dataset name. Such a pair is one configuration measured twice, not two
observations, so a fit or a count over designs must take it once (gap_vs_quality.fit does).

A run's training identity is what its record's experiment config (record.json "config", a path
relative to the checkout the matrix ran in) asks for, without the keys that only say where the run
writes (a value that is its run-dir or lies under it: run-dir, save, load, tensorboard-dir), plus
the base configs its matrix.json lists beside it and the steps it trained. Runs of equal identity
trained the same config and seed; their results can still differ where training is not
bit-reproducible (another thread count), which is why both are kept and averaged where they are
merged. A record whose config cannot be read has no identity (None) and is never merged.
"""
from __future__ import annotations

import json
import os

from megatron.config.untrusted_yaml import safe_load


def _read(path: str):
    try:
        with open(path) as f:
            return safe_load(f.read(), path)
    except (OSError, ValueError):
        return None


def training_identity(record: dict, root: str) -> str | None:
    """A string equal for two records that trained the same config (see the module docstring), or None."""
    if not record.get("config"):
        return None
    path = os.path.join(root, record["config"])
    config = _read(path)
    if not isinstance(config, dict):
        return None
    run_dir = str(config.get("run-dir", "")).rstrip("/")
    what = {k: v for k, v in config.items()
            if not (run_dir and isinstance(v, str) and (v == run_dir or v.startswith(run_dir + "/")))}
    matrix = _read(os.path.join(os.path.dirname(path), "matrix.json"))
    base = matrix.get("base_configs", []) if isinstance(matrix, dict) else []
    return json.dumps({"config": what, "base_configs": base, "steps": record.get("steps")}, sort_keys=True)


def identities(records, root: str) -> dict[tuple, str | None]:
    """{(dataset, train length, report name, seed): training identity}; the windowed evaluation of a
    kerple_log run (report name "kerple_log (window L)") is the same trained model, so it gets the
    run's identity too."""
    out = {}
    for rec in records:
        ident = training_identity(rec, root)
        L, label = rec.get("train_length"), rec.get("label", rec.get("scheme"))
        out[(rec["dataset"], L, label, rec["seed"])] = ident
        if L:
            out[(rec["dataset"], L, f"{label} (window {L})", rec["seed"])] = ident
    return out


def trained_as(identity: dict | None, dataset: str, train_length, scheme: str, seed) -> tuple:
    """What a result's run trained: its identity, or the result's own key where none is known (then it
    equals no other result's)."""
    ident = (identity or {}).get((dataset, train_length, scheme, seed))
    return ("config", ident) if ident is not None else ("run", dataset, train_length, scheme, seed)


def replicate_differences(runs, identity: dict) -> list[dict]:
    """Every pair of full-attention results that trained the same config and seed under two names: the pair's
    keys and {length: 100 (ppl_a / ppl_b - 1)} at the lengths both scored on the same text. What they differ
    by is run-to-run noise (training that is not bit-reproducible), the floor under any gap between runs."""
    by = {}
    for r in runs:
        if r.window is None and r.train_length:
            ident = (identity or {}).get((r.dataset, r.train_length, r.scheme, r.seed))
            if ident is not None:
                by.setdefault(ident, []).append(r)
    out = []
    for same in by.values():
        same = sorted(same, key=lambda r: str(r.key))
        for i, a in enumerate(same):
            for b in same[i + 1:]:
                diff = {L: 100.0 * (a.ppl[L] / b.ppl[L] - 1.0) for L in sorted(set(a.ppl) & set(b.ppl))
                        if a.same_text(L) == b.same_text(L)}
                out.append({"a": a.key, "b": b.key, "diff": diff})
    return out
