"""Do KERPLE heads learn flat kernels? The paper's §5.4 (Figs. 2-4) finds some KERPLE heads with
nearly flat learned kernels, which let those heads use distant context. Read off the run records'
kernel.json (f_h(d) for d = 0 .. 32x the train length L), per dataset, train length and head.

A head counts as flat when f_h(L) >= FLAT_AT_L = -ln 2: a key at the train-length distance keeps at
least half of the weight it would have at distance 0 (all else equal). The threshold is this
report's choice, stated with the table; the table also gives every head's f_h(L), f_h(8L) and
f_h(32L), so another threshold can be read off it.
"""
from __future__ import annotations

import json
import math
import os

FLAT_AT_L = -math.log(2.0)
SCHEMES = ("kerple_log", "kerple_power_ap_")  # the KERPLE kernels the paper's figures show
FACTORS = (1, 8, 32)


def head_values(records: list[dict], schemes=SCHEMES) -> list[dict]:
    """One row per (record, head) of the given schemes: dataset, train length, scheme, seed, head and
    f_h(k L) for k in FACTORS (None beyond the recorded distance)."""
    rows = []
    for rec in records:
        path = os.path.join(rec["dir"], "kernel.json")
        if rec["scheme"] not in schemes or not rec.get("train_length") or not os.path.isfile(path):
            continue
        with open(path) as f:
            kernel = json.load(f)["kernel"]
        L = int(rec["train_length"])
        for h, f_h in enumerate(kernel):
            values = {k: (f_h[k * L] if k * L < len(f_h) else None) for k in FACTORS}
            rows.append({"dataset": rec["dataset"], "train_length": L, "scheme": rec["label"], "seed": rec["seed"],
                         "head": h, "f": values, "flat": values[1] >= FLAT_AT_L})
    return sorted(rows, key=lambda r: (r["dataset"], r["train_length"], r["scheme"], str(r["seed"]), r["head"]))


def _fmt(v) -> str:
    return "–" if v is None else f"{v:.3g}"


def flat_markdown(rows: list[dict]) -> str:
    if not rows:
        return "No record has a KERPLE kernel.\n"
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["dataset"], r["train_length"], r["scheme"]), []).append(r)
    lines = ["| dataset | train length L | scheme | heads x seeds | flat heads | largest f(L) | median f(L) "
             "| largest f(32L) |", "|---|---:|---|---:|---:|---:|---:|---:|"]
    for (d, L, s), rs in groups.items():
        at_l = sorted(r["f"][1] for r in rs)
        far = [r["f"][32] for r in rs if r["f"][32] is not None]
        lines.append(f"| {d} | {L} | {s} | {len(rs)} | {sum(r['flat'] for r in rs)} | {_fmt(at_l[-1])} "
                     f"| {_fmt(at_l[len(at_l) // 2])} | {_fmt(max(far) if far else None)} |")
    lines += ["", f"Flat: f_h(L) >= -ln 2 = {FLAT_AT_L:.3f} (a key at the train-length distance keeps at least "
              "half the weight of one at distance 0, all else equal). Median: the upper median over heads x seeds.",
              "", "## Every head", "", "| dataset | L | scheme | seed | head | f(L) | f(8L) | f(32L) |",
              "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['dataset']} | {r['train_length']} | {r['scheme']} | {r['seed']} | {r['head']} "
                     f"| {_fmt(r['f'][1])} | {_fmt(r['f'][8])} | {_fmt(r['f'][32])} |")
    return "\n".join(lines) + "\n"
