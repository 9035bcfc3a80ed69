"""Retrieval results: accuracy per length x depth with a 95% interval, and the effective length.

Interval: Wilson's score interval for a binomial proportion at 95% (z = 1.96); unlike the normal
approximation it stays inside [0, 1] and is honest at 0/n and n/n, where small grids live.

Effective length (RULER, Hsieh et al. 2024, defines it as the longest length whose score stays
above a threshold): here, the longest evaluated length L such that at L and at every shorter
evaluated length, the accuracy pooled over all depths is at least the threshold. RULER takes
its threshold from a reference model's score; ours is stated with the figure (--retrieval-threshold,
default 0.8 of multiple-choice accuracy, with chance 1/K printed beside it). None: the threshold
is missed already at the shortest length.
"""
from __future__ import annotations


def wilson_interval(correct: int, n: int) -> tuple[float, float]:
    """The 95% Wilson score interval of correct / n (scipy's; (0, 1) for n = 0: nothing is known)."""
    if n == 0:
        return 0.0, 1.0
    from scipy.stats import binomtest  # lazy: scipy, only once there is something to summarise

    ci = binomtest(correct, n).proportion_ci(confidence_level=0.95, method="wilson")
    return float(ci.low), float(ci.high)


# Each scoring's verdict in a sample row (grid.sample_row)
VERDICT = {"choice": "correct", "exact_match": "exact_match"}


def _cell(rows: list[dict], scoring: str) -> dict:
    n, right = len(rows), sum(bool(r[VERDICT[scoring]]) for r in rows)
    lo, hi = wilson_interval(right, n)
    return {"n": n, "correct": right, "accuracy": right / n if n else None, "interval": [round(lo, 4), round(hi, 4)]}


def effective_length(by_length: dict[int, float | None], threshold: float) -> int | None:
    """The longest length L whose accuracy, and every shorter length's, is >= threshold."""
    best = None
    for length in sorted(by_length):
        acc = by_length[length]
        if acc is None or acc < threshold:
            break
        best = length
    return best


def summarize(samples: list[dict], lengths: list[int], depths: list[float], candidates: int,
              threshold: float, generated: bool) -> dict:
    """The eval.json section of one task from its sample rows (samples.jsonl's rows)."""
    scorings = ["choice"] + (["exact_match"] if generated else [])
    cells, by_length = [], {}
    for length in lengths:
        at = [r for r in samples if r["length"] == length]
        for depth in depths:
            here = [r for r in at if r["depth"] == depth]
            cells.append({"length": length, "depth": depth, **{s: _cell(here, s) for s in scorings}})
        by_length[str(length)] = {s: _cell(at, s) for s in scorings}
    return {
        "candidates": candidates, "chance": 1 / candidates, "threshold": threshold,
        "lengths": lengths, "depths": depths, "scorings": scorings, "cells": cells, "by_length": by_length,
        "effective_length": {s: effective_length({int(k): v[s]["accuracy"] for k, v in by_length.items()}, threshold)
                             for s in scorings},
    }


def markdown(task: str, section: dict, train_length: int | None) -> str:
    """One table per task: rows are lengths, columns depths (multiple-choice accuracy), then the
    pooled accuracy with its interval and, when generated, exact match."""
    depths, scorings = section["depths"], section["scorings"]
    head = ["length", "x train"] + [f"{d:g}%" for d in depths] + ["all depths (95% CI)"]
    if "exact_match" in scorings:
        head.append("greedy exact match")
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for length in section["lengths"]:
        cells = {c["depth"]: c for c in section["cells"] if c["length"] == length}
        pooled = section["by_length"][str(length)]
        lo, hi = pooled["choice"]["interval"]
        row = [str(length), f"{length / train_length:g}" if train_length else "-"]
        row += [_pct(cells[d]["choice"]["accuracy"]) for d in depths]
        row.append(f"{_pct(pooled['choice']['accuracy'])} ({_pct(lo)}-{_pct(hi)})")
        if "exact_match" in scorings:
            row.append(_pct(pooled["exact_match"]["accuracy"]))
        lines.append("| " + " | ".join(row) + " |")
    eff = section["effective_length"]
    said = ", ".join(f"{s}: {eff[s] if eff[s] is not None else 'below the threshold at every length'}"
                     for s in scorings)
    return (f"Retrieval `{task}`: multiple choice among {section['candidates']} values by likelihood (chance "
            f"{_pct(section['chance'])}), {section['cells'][0]['choice']['n']} prompts per cell, filler "
            f"`{section.get('filler')}`.\n\n" + "\n".join(lines)
            + f"\n\nEffective length (accuracy over all depths >= {section['threshold']:g} at that length and every "
              f"shorter one): {said}.")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"
