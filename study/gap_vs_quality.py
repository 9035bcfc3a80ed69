"""Does a gap follow the train length or how good the model is? (reproduction v3, issue 24)

Both trend designs move model quality along with the train length L: at equal tokens the longer L
trains worse, at equal sequences better (train_length_quality.py), so neither separates the two.
Across every group of one corpus this puts each seed-paired gap (trend.py's GAPS at 8x and 32x)
next to the quality q of its kerple_log run and fits, by least squares over all of them,

    gap = a + b log2(q) + c log2(L)

c: the gap's change per doubling of L at fixed quality; b: per doubling of q at fixed L. q is
kerple_log's perplexity over the first L0 positions of its windows (L0: the corpus's shortest train
length), at the evaluation length that the most of these runs scored on the same windows
(RunResult.same_text). Every model is inside its training length there, so q measures how well it
learned the language, not how it extrapolates, which is what the gaps measure. Runs scored on other
windows have no q and are named as left out.

Two groups can hold the same training config (replicates.py: the equal-sequence design's L = 64 is
the equal-token design's L = 64). Such a pair is one configuration, so every fit counts it once
(count_once: one point with the mean gap and the geometric-mean q of its runs); leaving one group
out keeps the configuration while another group still has it, as the runs that group trained.
"""
from __future__ import annotations

import math
import os
from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from study.replicates import trained_as
from study.trend import GAPS, REFERENCE, gap_points


@dataclass(frozen=True)
class GapPoint:
    dataset: str
    train_length: int
    seed: int | str
    quality: float  # kerple_log's perplexity over positions 0..L0-1
    gap: float  # %
    trained: tuple = ()  # what its runs trained (replicates.trained_as of each); equal: the same config twice
    runs: int = 1  # how many measurements of that config it stands for (count_once's mean)

    @property
    def config(self) -> tuple:
        return self.trained or (self.dataset, self.train_length, self.seed)


def count_once(points: list[GapPoint]) -> list[GapPoint]:
    """The points with every set of replicates (equal `trained`) replaced by one point: the mean gap, the
    geometric-mean q (the fits are linear in log q), the groups joined by " = " (first-seen order kept)."""
    by = defaultdict(list)
    for p in points:
        by[p.config].append(p)
    out = []
    for same in by.values():
        if len(same) == 1:
            out.append(same[0])
            continue
        first = same[0]
        out.append(GapPoint(" = ".join(sorted({p.dataset for p in same})), first.train_length, first.seed,
                            float(np.exp(np.mean([math.log(p.quality) for p in same]))),
                            float(np.mean([p.gap for p in same])), first.trained, sum(p.runs for p in same)))
    return out


def replicate_sets(points: list[GapPoint]) -> list[list[GapPoint]]:
    """Every set of two or more points that trained the same config."""
    by = defaultdict(list)
    for p in points:
        by[p.config].append(p)
    return [same for same in by.values() if len(same) > 1]


def corpus_name(corpus: tuple) -> str:
    """'latex_full' for (data path, split, ...) scored on the test split as windows; the rest named when set."""
    path, split, mode, stride, min_doc, block = (tuple(corpus) + (None,) * 6)[:6]
    name = os.path.basename(str(path or "unknown")).removesuffix("_text_document")
    extras = [f"{split} split" if split not in (None, "test") else "", f"{mode}" if mode not in (None, "non-overlapping") else "",
              f"stride {stride}" if stride else "", f"documents >= {min_doc} tokens" if min_doc else "",
              f"blockwise causal {block}" if block else ""]
    extras = [e for e in extras if e]
    return name + (f" ({', '.join(extras)})" if extras else "")


def _head_ppl(run, length: int, positions: int) -> float | None:
    """Perplexity over the window's first `positions` positions at this evaluation length, or None."""
    loss = run.loss_over(length, 0, positions)
    return None if loss is None else math.exp(loss)


def gap_quality_points(runs, identity: dict | None = None) -> dict[str, dict]:
    """{corpus name: {"length": E, "head": L0, "points": {(gap, factor): [GapPoint]}, "left_out": [(dataset, L, seed)]}}
    for corpora whose points span two or more train lengths. identity: replicates.identities of the runs'
    records (without it no two points are taken for the same config)."""
    refs = defaultdict(list)  # corpus -> kerple_log full-attention runs
    for r in runs:
        if r.scheme == REFERENCE and r.window is None and r.train_length:
            refs[r.corpus].append(r)
    gaps = gap_points(runs, min_lengths=1)
    out = {}
    for corpus, members in sorted(refs.items(), key=lambda kv: corpus_name(kv[0])):
        head = min(r.train_length for r in members)
        keys = Counter((E, r.same_text(E)) for r in members for E in r.positionwise
                       if _head_ppl(r, E, head) is not None)
        if not keys:
            continue
        (length, text), _ = min(keys.items(), key=lambda kv: (-kv[1], kv[0][0]))
        quality = {(r.dataset, r.train_length, r.seed): _head_ppl(r, length, head) for r in members
                   if r.same_text(length) == text}
        datasets = {r.dataset for r in members}
        points, left_out = defaultdict(list), set()
        for (d, gap, k), g in gaps.items():
            if d not in datasets:
                continue
            for L, by_seed in g["points"].items():
                for seed, value in by_seed.items():
                    q = quality.get((d, L, seed))
                    if q is None:
                        left_out.add((d, L, seed))
                    else:
                        trained = tuple(trained_as(identity, d, L, s, seed) for s in (GAPS[gap] or REFERENCE, REFERENCE))
                        points[(gap, k)].append(GapPoint(d, L, seed, q, value, trained))
        if len({p.train_length for pts in points.values() for p in pts}) >= 2:
            name = corpus_name(corpus)
            if name in out:  # two corpora whose files share a name: the full path tells them apart
                name = f"{name}, {corpus[0]}"
            out[name] = {"length": length, "head": head, "points": dict(points),
                                        "left_out": sorted(left_out, key=str)}
    return out


def fit(points: list[GapPoint]) -> dict | None:
    """gap = a + b log2(q) + c log2(L) by least squares over count_once(points) (a config trained twice is one
    point): {"n", "c": (coef, se, p), "b": (coef, se, p), "r2"},
    and the one-variable fits "L only" and "q only" as (slope, se, p, r2); None below 5 points or when L
    and q are collinear (one train length, or one quality). "r(q, L)": the correlation of log2 q with log2 L;
    near +-1, b and c cannot be told apart (their standard errors say how far)."""
    points = count_once(points)
    n = len(points)
    if n < 5:
        return None
    y = np.array([p.gap for p in points])
    lq = np.log2([p.quality for p in points])
    lL = np.log2([p.train_length for p in points])
    X = np.column_stack([np.ones(n), lq, lL])
    if np.linalg.matrix_rank(X) < 3:
        return None
    beta, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ beta
    dof = n - 3
    sigma2 = float(resid @ resid) / dof
    se = np.sqrt(np.diag(sigma2 * np.linalg.inv(X.T @ X)))
    p = 2 * sps.t.sf(np.abs(beta / se), dof)
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(resid @ resid) / total if total > 0 else float("nan")

    def single(x):
        res = sps.linregress(x, y)
        return float(res.slope), float(res.stderr), float(res.pvalue), float(res.rvalue ** 2)

    return {"n": n, "b": (float(beta[1]), float(se[1]), float(p[1])), "c": (float(beta[2]), float(se[2]), float(p[2])),
            "r2": r2, "L only": single(lL), "q only": single(lq), "r(q, L)": float(np.corrcoef(lq, lL)[0, 1])}


def leave_one_group_out(points: list[GapPoint]) -> dict[str, dict | None]:
    """{group: the fit without that group's points}: whether one design (a group of one recipe, often a
    handful of runs) carries the result alone. Empty for a single group. A config two groups trained
    stays in with the other group's runs of it (the fit counts it once either way)."""
    groups = sorted({p.dataset for p in points})
    if len(groups) < 2:
        return {}
    return {d: fit([p for p in points if p.dataset != d]) for d in groups}


def _coef(c: tuple) -> str:
    return f"{c[0]:+.2f} ± {c[1]:.2f} (p = {c[2]:.2g})"


def gap_quality_markdown(result: dict) -> str:
    if not result:
        return "No corpus has paired gaps at two train lengths with kerple_log scored on the same windows.\n"
    lines = []
    for name, res in result.items():
        E, L0, points = res["length"], res["head"], res["points"]
        lines += [f"### {name}", "",
                  f"q: kerple_log's perplexity over positions 0-{L0 - 1} of the windows at evaluation length {E} "
                  f"(the same windows for every run listed). Fit: gap = a + b log2(q) + c log2(L) over every point; "
                  f"c is the change of the gap (points of %) per doubling of L at fixed q, b per doubling of q at "
                  f"fixed L; r(q, L): the correlation of log2 q with log2 L (near ±1 the two cannot be told apart); "
                  f"the one-variable fits give the slope on L alone and on q alone, with R².", "",
                  "| gap | at | n | r(q, L) | c: per doubling of L, fixed q | b: per doubling of q, fixed L | R² (both) "
                  "| L alone: slope, R² | q alone: slope, R² |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for (gap, k), pts in points.items():
            f = fit(pts)
            if f is None:
                lines.append(f"| {gap} | {k}x | {len(pts)} | – | – | – | – | – | – |")
                continue
            lines.append(f"| {gap} | {k}x | {f['n']} | {f['r(q, L)']:+.2f} | {_coef(f['c'])} | {_coef(f['b'])} | {f['r2']:.2f} | "
                         f"{_coef(f['L only'][:3])}, {f['L only'][3]:.2f} | {_coef(f['q only'][:3])}, {f['q only'][3]:.2f} |")
        sensitivity = [(gap, k, d, f) for (gap, k), pts in points.items() for d, f in leave_one_group_out(pts).items()]
        if sensitivity:
            lines += ["", "The same fit leaving out one group at a time:", "",
                      "| gap | at | without | n | c: per doubling of L, fixed q | b: per doubling of q, fixed L |",
                      "|---|---:|---|---:|---:|---:|"]
            for gap, k, d, f in sensitivity:
                lines.append(f"| {gap} | {k}x | {d} | " + ("– | – | – |" if f is None else
                             f"{f['n']} | {_coef(f['c'])} | {_coef(f['b'])} |"))
        cols = list(points)
        rows = {}
        for col in cols:
            for p in points[col]:
                rows.setdefault((p.dataset, p.train_length, p.seed), [p.quality, {}])[1][col] = p.gap
        lines += ["", "Every point, best model first (gap in % of kerple_log's perplexity; negative: A better):", "",
                  "| group | L | seed | q | " + " | ".join(f"{gap}, {k}x" for gap, k in cols) + " |",
                  "|---|---:|---:|---:|" + "---:|" * len(cols)]
        for (d, L, seed), (q, by_col) in sorted(rows.items(), key=lambda kv: (kv[1][0], str(kv[0]))):
            lines.append(f"| {d} | {L} | {seed} | {q:.2f} | "
                         + " | ".join(f"{by_col[c]:+.2f}" if c in by_col else "–" for c in cols) + " |")
        same = defaultdict(set)  # the groups (at one L) that trained one config -> its seeds
        for pts in points.values():
            for reps in replicate_sets(pts):
                same[(tuple(sorted({p.dataset for p in reps})), reps[0].train_length)].add(reps[0].seed)
        for (groups, L), seeds in sorted(same.items(), key=str):
            lines += ["", f"Counted once in every fit: {' and '.join(f'{d} L = {L}' for d in groups)} trained the same "
                      f"config (seeds {', '.join(map(str, sorted(seeds, key=str)))}; study/replicates.py), so "
                      "each seed is one point there, its gap the mean and its q the geometric mean of the runs listed "
                      "above."]
        if res["left_out"]:
            lines += ["", "Left out (kerple_log scored on other windows at this length, or not at it): "
                      + ", ".join(f"{d} L = {L} seed {s}" for d, L, s in res["left_out"]) + "."]
        lines.append("")
    return "\n".join(lines)
