"""The train-length trend (reproduction v3, issue 24): do the gaps behind the two reversed claims
shrink as the train length L grows?

A gap is 100 * (ppl_A / ppl_B - 1) of two runs of the same dataset, train length and seed, at k x L
(k in FACTORS); negative = A better:
    windowed - full   kerple_log scored with window L (the paper's windowed@L)  vs  kerple_log
    power - log       kerple_power_ap_                                          vs  kerple_log
    alibi - log       alibi                                                     vs  kerple_log
Per (dataset, gap, factor, L): mean ± sample std over the paired seeds, and the missing pairs: a
seed one scheme has at that L and the other lacks, or a planned run (a matrix.json entry with a
train length) that has no result yet. The windowed gap is not given at 1x (a window of L over L
tokens is full attention). Per (dataset,
gap, factor): the least-squares slope of the gap against log2 L over every (L, seed) point, with its
p-value (scipy.stats.linregress): the change of the gap per doubling of the train length.
"""
from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
from scipy import stats as sps

from megatron.evaluation.stats import holm
from study.experiments import read_matrix

REFERENCE = "kerple_log"
GAPS = {"windowed - full": None, "power - log": "kerple_power_ap_", "alibi - log": "alibi"}  # None: windowed@L
FACTORS = (1, 8, 32)


def _scheme_a(gap: str, train_length: int) -> str:
    return GAPS[gap] or f"{REFERENCE} (window {train_length})"


def gap_points(runs, planned: set | None = None, min_lengths: int = 2) -> dict[tuple, dict]:
    """{(dataset, gap, factor): {"points": {L: {seed: gap %}}, "missing": {L: [(seed, lacking scheme)]}}}
    for datasets whose reference has min_lengths or more train lengths, recorded or planned. planned: {(dataset, L,
    scheme, seed)} of the matrices' runs (a planned kerple_log run brings its windowed@L evaluation)."""
    planned = set(planned or ())
    planned |= {(d, L, f"{REFERENCE} (window {L})", seed) for d, L, s, seed in planned if s == REFERENCE}
    ppl = defaultdict(dict)  # (dataset, L, scheme) -> {seed: {length: ppl}}
    for r in runs:
        if r.train_length:
            ppl[(r.dataset, r.train_length, r.scheme)][r.seed] = r.ppl
    lengths = defaultdict(set)  # the reference's train lengths, recorded or planned
    for d, L, s in [*ppl, *(key[:3] for key in planned)]:
        if s == REFERENCE:
            lengths[d].add(L)
    out = {}
    for d, Ls in sorted(lengths.items()):
        if len(Ls) < min_lengths:
            continue
        for gap in GAPS:
            if GAPS[gap] and not any(dd == d and s == GAPS[gap] for dd, _, s, *_ in [*ppl, *planned]):
                continue  # a scheme this dataset's matrix does not train: no gap, rather than every pair missing
            for k in FACTORS[1:] if GAPS[gap] is None else FACTORS:
                points, missing = {}, {}
                for L in sorted(Ls):
                    a, b = ppl.get((d, L, _scheme_a(gap, L)), {}), ppl.get((d, L, REFERENCE), {})
                    pts = {seed: 100.0 * (a[seed][k * L] / b[seed][k * L] - 1.0) for seed in sorted(set(a) & set(b))
                           if k * L in a[seed] and k * L in b[seed]}
                    if pts:
                        points[L] = pts
                    lacking = {(seed, s) for s, have in ((_scheme_a(gap, L), a), (REFERENCE, b))
                               for seed in set(a) | set(b) if seed not in have}
                    lacking |= {(seed, s) for dd, LL, s, seed in planned if (dd, LL) == (d, L)
                                and s in (_scheme_a(gap, L), REFERENCE) and seed not in (a if s != REFERENCE else b)}
                    missing[L] = sorted(lacking, key=str)
                out[(d, gap, k)] = {"points": points, "missing": missing}
    return out


def planned_runs(matrices) -> set:
    """{(dataset, train length, report name, seed)} of the matrix.json files' runs that name a train length."""
    out = set()
    for path in matrices:
        for r in read_matrix(path)[1]:
            if r.train_length:
                out.add((r.dataset, r.train_length, r.label or r.scheme, r.seed))
    return out


def slope(points: dict) -> tuple[float, float, float] | None:
    """(gap change per doubling of L, its standard error, p) over every (L, seed) point, or None
    unless two train lengths have two seeds or more each (one seed at a length would make the
    test a comparison of one run with the other length's mean)."""
    xs = [math.log2(L) for L, pts in points.items() for _ in pts]
    ys = [v for pts in points.values() for v in pts.values()]
    if sum(len(pts) >= 2 for pts in points.values()) < 2:
        return None
    res = sps.linregress(xs, ys)
    return float(res.slope), float(res.stderr), float(res.pvalue)


def _cell(pts: dict) -> str:
    v = np.array(list(pts.values()))
    return f"{v.mean():+.1f} ± {v.std(ddof=1):.1f} (n={v.size})" if v.size > 1 else f"{v[0]:+.1f} (n=1)"


def significant_lengths(cells: list[dict], dataset: str, train_length: int, scheme: str) -> list[int]:
    """Lengths at which `scheme` beats the reference significantly (Table 3's ‡) in this group."""
    return sorted(c["length"] for c in cells if (c["dataset"], c["train_length"], c["scheme"]) ==
                  (dataset, train_length, scheme) and c["better"])


def has_points(gaps: dict, dataset: str) -> bool:
    """Whether any gap of this dataset has a recorded pair (a planned-only dataset has none)."""
    return any(g["points"] for (d, _, _), g in gaps.items() if d == dataset)


def trend_markdown(gaps: dict, cells: list[dict]) -> str:
    if not gaps:
        return "No dataset has kerple_log records at two or more train lengths yet.\n"
    lines = []
    for d in sorted({d for d, _, _ in gaps}):
        Ls = sorted({L for (dd, _, _), g in gaps.items() if dd == d for L in g["missing"]})
        if not has_points(gaps, d):  # planned only: no table of dashes, no significance list
            lines += [f"## {d}", "", f"No pair recorded yet (train lengths {', '.join(map(str, Ls))} planned).", ""]
            continue
        lines += [f"## {d}", "", "Gap = 100 (ppl_A / ppl_B - 1) in %, mean ± std over paired seeds (negative: A "
                  "better). Slope: change of the gap per doubling of L (least squares over every seed), ± its "
                  "standard error, p (raw) and Holm (p adjusted over every slope of this table, one family); given "
                  "once two train lengths have two seeds or more.", "",
                  "| gap | at | " + " | ".join(f"L = {L}" for L in Ls) + " | slope per doubling of L |",
                  "|---|---:|" + "---:|" * len(Ls) + "---:|"]
        rows = [(gap, k, g, slope(g["points"])) for (dd, gap, k), g in gaps.items() if dd == d]
        adjusted = holm(math.nan if s is None else s[2] for *_, s in rows)  # the table's slopes: one family
        for (gap, k, g, s), q in zip(rows, adjusted):
            row = [_cell(g["points"][L]) if L in g["points"] else "–" for L in Ls]
            s_text = "–" if s is None else f"{s[0]:+.1f} ± {s[1]:.1f} (p = {s[2]:.2g}, Holm {q:.2g})"
            lines.append(f"| {gap} | {k}x | " + " | ".join(row) + f" | {s_text} |")
        lines += ["", "Per seed (the same seed at every train length):", "",
                  "| gap | at | seed | " + " | ".join(f"L = {L}" for L in Ls) + " |", "|---|---:|---:|" + "---:|" * len(Ls)]
        for (dd, gap, k), g in gaps.items():
            seeds = sorted({seed for pts in g["points"].values() for seed in pts}, key=str)
            for seed in seeds if dd == d else []:
                row = [f"{g['points'][L][seed]:+.1f}" if seed in g["points"].get(L, {}) else "–" for L in Ls]
                lines.append(f"| {gap} | {k}x | {seed} | " + " | ".join(row) + " |")
        lines += ["", "Missing pairs (seed: the run that is not in the records yet):"]
        for (dd, gap, k), g in gaps.items():
            if dd == d and k == FACTORS[-1]:  # the same at every factor
                for L, miss in g["missing"].items():
                    if miss:
                        lines.append(f"- {gap}, L = {L}: " + ", ".join(f"{seed} ({s})" for seed, s in miss))
        lines += ["", "Where Table 3 marks the scheme significantly better than full-attention kerple_log (‡):"]
        for L in Ls:
            for label, scheme in (("windowed@L", f"{REFERENCE} (window {L})"), ("kerple_power_ap_", "kerple_power_ap_")):
                sig = significant_lengths(cells, d, L, scheme)
                lines.append(f"- L = {L}, {label}: " + (", ".join(f"{x} ({x // L}x)" for x in sig) if sig else "none"))
        lines.append("")
    return "\n".join(lines)
