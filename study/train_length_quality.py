"""Model quality against the train length at a fixed training budget (reproduction v3, issue 24).

The trend matrix trains every train length L on the same tokens, steps and schedule. Whether that
gives an equally good language model at every L decides what trend.py's gaps compare: the train
length alone, or the train length and how well each model trained (the windowed gap moves with
training quality, docs/results/README.md). Perplexities of two train lengths compare only on the
same text, so this uses the evaluation lengths that every L of a group scored on the same windows
(RunResult.same_text).

Per (dataset, scheme, evaluation length) of full-attention runs: each L's perplexity (mean ± std
over seeds) and its change against the shortest train length L0 of the same seed, in %; and the
same change over the window's positions from L0 on only. There the L0 model extrapolates (it never
trained at those positions) and the longer-L models trained at some or all of them: a longer-L
model that is still worse there is a worse language model, not a better extrapolator held back.
"""
from __future__ import annotations

import math
from collections import defaultdict

import numpy as np


def quality_points(runs) -> dict[tuple, dict]:
    """{(dataset, scheme, eval length): {L: {seed: (ppl, loss from L0 on or None)}}} for full-attention
    runs, at the evaluation lengths that every train length (two or more) of the scheme scored on
    the same windows (equal data seed, window order and window count; a length scored on different
    windows by two train lengths is left out, since its perplexities are not comparable)."""
    full = [r for r in runs if r.window is None and r.train_length]
    shortest = defaultdict(lambda: math.inf)  # (dataset, scheme) -> L0
    for r in full:
        shortest[(r.dataset, r.scheme)] = min(shortest[(r.dataset, r.scheme)], r.train_length)
    groups = defaultdict(lambda: defaultdict(dict))  # (dataset, scheme, length, windows identity) -> {L: {seed: ...}}
    for r in full:
        for length, ppl in r.ppl.items():
            identity = r.same_text(length)
            late = r.loss_over(length, shortest[(r.dataset, r.scheme)])
            groups[(r.dataset, r.scheme, length, identity)][r.train_length][r.seed] = (ppl, late)
    per_length = defaultdict(list)  # (dataset, scheme, length) -> the identities it was scored with
    trained = defaultdict(set)  # (dataset, scheme) -> its train lengths
    for d, s, length, identity in groups:
        per_length[(d, s, length)].append(identity)
        trained[(d, s)] |= set(groups[(d, s, length, identity)])
    out = {}
    for (d, s, length), identities in sorted(per_length.items(), key=str):
        if len(identities) != 1:  # two train lengths, two samples of the split: not the same text
            continue
        by_L = groups[(d, s, length, identities[0])]
        if len(by_L) >= 2 and set(by_L) == trained[(d, s)]:  # every train length, so each row has the same base
            out[(d, s, length)] = {L: dict(by_L[L]) for L in sorted(by_L)}
    return out


def _mean_std(values) -> str:
    v = np.asarray(values, dtype=float)
    return f"{v.mean():.2f} ± {v.std(ddof=1):.2f}" if v.size > 1 else f"{v[0]:.2f}"


def _change(pairs) -> str:
    """Paired % change (each seed against itself at the shortest L), mean ± std and n."""
    v = np.asarray(pairs, dtype=float)
    if v.size == 0:
        return "–"
    return f"{v.mean():+.1f} ± {v.std(ddof=1):.1f} (n={v.size})" if v.size > 1 else f"{v[0]:+.1f} (n=1)"


def changes(by_L: dict, late: bool = False) -> dict[int, list[float]]:
    """{L: [% change of each seed's perplexity against the same seed at the shortest L]} for the
    longer L; late: over the positions from the shortest L on only (seeds without that curve, or
    lengths with no such position, are left out)."""
    base_L = min(by_L)
    out = {}
    for L in sorted(by_L)[1:]:
        vals = []
        for seed, (ppl, e) in by_L[L].items():
            if seed not in by_L[base_L]:
                continue
            base_ppl, base_e = by_L[base_L][seed]
            if late:
                if e is not None and base_e is not None:
                    vals.append(100.0 * (math.exp(e - base_e) - 1.0))
            else:
                vals.append(100.0 * (ppl / base_ppl - 1.0))
        out[L] = vals
    return out


def quality_markdown(points: dict) -> str:
    if not points:
        return "No scheme has full-attention runs of two train lengths scored on the same windows.\n"
    lines = []
    for d in sorted({d for d, _, _ in points}):
        Ls = sorted({L for (dd, _, _), by_L in points.items() if dd == d for L in by_L})
        longer = Ls[1:]
        lines += [f"### {d}", "",
                  f"Perplexity on the same windows (mean ± std over seeds), and the change against the same seed "
                  f"trained at L = {Ls[0]}: over the whole window, and over its positions from {Ls[0]} on only "
                  f"(where the L = {Ls[0]} model extrapolates).", "",
                  "| scheme | length | " + " | ".join(f"L = {L}" for L in Ls) + " | "
                  + " | ".join(f"L = {L} vs {Ls[0]}" for L in longer) + " | "
                  + " | ".join(f"positions >= {Ls[0]}, L = {L} vs {Ls[0]}" for L in longer) + " |",
                  "|---|---:|" + "---:|" * (len(Ls) + 2 * len(longer))]
        for (dd, scheme, length), by_L in sorted(points.items(), key=lambda kv: (kv[0][1], kv[0][2])):
            if dd != d:
                continue
            ppl = [_mean_std([p for p, _ in by_L[L].values()]) if L in by_L else "–" for L in Ls]
            whole, late = changes(by_L), changes(by_L, late=True)
            lines.append(f"| {scheme} | {length} | " + " | ".join(ppl) + " | "
                         + " | ".join(_change(whole.get(L, [])) for L in longer) + " | "
                         + " | ".join(_change(late.get(L, [])) for L in longer) + " |")
        lines.append("")
    return "\n".join(lines)
