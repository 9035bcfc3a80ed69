"""How much of the seed-to-seed spread is "how well the run trained"? The correlation, over the runs
of one dataset and train length, between each run's final training perplexity (exp of the mean
lm_loss over the last TAIL_STEPS steps of the record's trajectory, which holds every 10th step)
and its test perplexity at 1x, with and without each scheme (which scheme drives r).
"""
from __future__ import annotations

import json
import math
import os
from collections import defaultdict

import numpy as np

TAIL_STEPS = 100
MIN_RUNS = 5  # fewer runs: no row (r of 3 points is close to +-1 whatever they are)


def final_train_ppl(trajectory: dict, tail: int = TAIL_STEPS) -> float:
    """exp(mean lm_loss) over the logged steps in the last `tail` steps (the last step included)."""
    it = np.asarray(trajectory["iteration"], dtype=float)
    loss = np.asarray(trajectory["lm_loss"], dtype=float)
    return float(math.exp(loss[it > it[-1] - tail].mean()))


def pairs(records: list[dict]) -> dict[tuple, list[tuple[str, float, float]]]:
    """{(dataset, train length): [(scheme, final train ppl, test ppl at 1x)]}."""
    out = defaultdict(list)
    for rec in records:
        path = os.path.join(rec["dir"], "eval.json")
        if not os.path.isfile(path) or "lm_loss" not in rec["trajectory"]:
            continue
        with open(path) as f:
            ppl = {int(r["length"]): float(r["ppl"]) for r in json.load(f)["results"]}
        L = rec.get("train_length")
        if L in ppl:
            out[(rec["dataset"], L)].append((rec["label"], final_train_ppl(rec["trajectory"]), ppl[L]))
    return dict(sorted(out.items()))


def _r(rows) -> float:
    if len(rows) < 3:
        return math.nan
    return float(np.corrcoef([x for _, x, _ in rows], [y for _, _, y in rows])[0, 1])


def train_test_markdown(groups: dict) -> str:
    lines = ["| dataset | train length | runs | r, all runs | r without the scheme that moves it most | r range "
             "leaving out one scheme |", "|---|---:|---:|---:|---|---:|"]
    few = []
    for (d, L), rows in groups.items():
        if len(rows) < MIN_RUNS:
            few.append(f"{d} {L} ({len(rows)})")
            continue
        r_all = _r(rows)
        without = {s: _r([x for x in rows if x[0] != s]) for s in sorted({x[0] for x in rows})}
        driver = max(without, key=lambda s: abs(without[s] - r_all) if not math.isnan(without[s]) else -1)
        lo, hi = min(without.values()), max(without.values())
        lines.append(f"| {d} | {L} | {len(rows)} | {r_all:.3f} | {driver}: {without[driver]:.3f} "
                     f"| {lo:.3f} - {hi:.3f} |")
    if few:
        lines += ["", f"Too few runs for a correlation (fewer than {MIN_RUNS}): " + ", ".join(few) + "."]
    return "\n".join(lines) + (f"\n\nPearson r between each run's final training perplexity (exp of the mean lm_loss over "
                               f"the logged steps of its last {TAIL_STEPS}: every 10th step) and its test "
                               "perplexity at 1x the train length.\n")
