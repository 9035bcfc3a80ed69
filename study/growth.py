"""How much of a scheme's lead over the reference comes from extrapolation (issue 24)?

Table 3 compares perplexities at k x L. Such a gap mixes two things: how good a language model the
run is at its train length L (its gap at 1x, which follows how each run trained: kerple_power_ap_
against kerple_log goes from -9% to +14% at 1x between seeds of one domain) and how much perplexity
it gains as the length grows. The growth gap keeps only the second:

    growth gap at k = 100 * ((ppl_A(kL) / ppl_A(L)) / (ppl_B(kL) / ppl_B(L)) - 1)     (negative: A better)

for runs A and B (the reference, kerple_log) of one group (dataset, train length) and one seed; a run
that is 10% worse everywhere has a growth gap of 0. Per (group, full-attention scheme): the pairs, the
1x and kx gaps and the growth gap (mean ± std over the paired seeds), how many pairs have a negative
growth gap, and the paired t-test of the growth ratios ppl(kL) / ppl(L) (stats.paired_test, the test of
Table 3) with its raw p, its Holm-adjusted p over the row's family (the scheme's factors, as Table 3's
rows) and the exact sign-flip p; the marks follow the adjusted p († the reference grows
significantly less, ‡ the scheme does). The windowed baseline
is left out: at 1x it is the full-attention model, so its growth gap is its Table 3 gap.
"""
from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from megatron.evaluation.stats import correct_family, paired_test
from study.aggregate import group_title, groups_of, order_schemes

FACTORS = (8, 32)


def _gap(a: float, b: float) -> float:
    return 100.0 * (a / b - 1.0)


def growth_rows(runs, reference: str = "kerple_log", alpha: float = 0.05) -> dict[tuple, list[dict]]:
    """{(dataset, train length): [row per scheme]}; a row: scheme, seeds (paired), gap_1x {seed: %},
    gap {k: {seed: %}}, growth {k: {seed: %}}, test {k: PairedTest of the growth ratios}. Only
    full-attention runs with a train length and seeds paired with the reference at 1x and k x L."""
    out = {}
    for (dataset, L), group in groups_of([r for r in runs if r.window is None and r.train_length]).items():
        by = defaultdict(dict)  # scheme -> {seed: {length: ppl}}
        for r in group:
            by[r.scheme][r.seed] = r.ppl
        ref = by.get(reference, {})
        rows = []
        for scheme in order_schemes(by, reference):
            if scheme == reference:
                continue
            row = {"scheme": scheme, "gap_1x": {}, "gap": {}, "growth": {}, "test": {}}
            for k in FACTORS:
                seeds = sorted((s for s in set(by[scheme]) & set(ref)
                                if all(x in p for p in (by[scheme][s], ref[s]) for x in (L, k * L))), key=str)
                if len(seeds) < 2:
                    continue
                a, b = by[scheme], ref
                row["gap_1x"].update({s: _gap(a[s][L], b[s][L]) for s in seeds})
                row["gap"][k] = {s: _gap(a[s][k * L], b[s][k * L]) for s in seeds}
                row["growth"][k] = {s: _gap(a[s][k * L] / a[s][L], b[s][k * L] / b[s][L]) for s in seeds}
                row["test"][k] = paired_test({s: b[s][k * L] / b[s][L] for s in seeds},
                                             {s: a[s][k * L] / a[s][L] for s in seeds}, alpha)
            if row["growth"]:
                rows.append(row)
        for row in rows:  # one family per row: the scheme against the reference at every factor
            ks = [k for k in FACTORS if k in row["test"] and not math.isnan(row["test"][k].p)]
            row["test"].update(zip(ks, correct_family([row["test"][k] for k in ks], alpha)))
        if rows:
            out[(dataset, L)] = rows
    return out


def _mean_std(values) -> str:
    v = np.array(list(values), dtype=float)
    return f"{v.mean():+.1f} ± {v.std(ddof=1):.1f}"


def _p(p: float) -> str:
    return "–" if math.isnan(p) else f"{p:.2g}"


def growth_markdown(groups: dict, reference: str = "kerple_log", alpha: float = 0.05) -> str:
    if not groups:
        return f"No group has two or more seeds of a scheme paired with {reference} at 1x and {FACTORS[0]}x.\n"
    lines = [f"Gaps against `{reference}` in % (mean ± std over the paired seeds; negative: the scheme better). "
             f"Growth gap at k: 100 ((ppl(kL) / ppl(L)) / ({reference}'s ppl(kL) / ppl(L)) - 1), the part of the "
             "kx gap that is not already there at 1x. `< 0`: pairs whose growth gap is negative. p: paired t-test of "
             "the growth ratios (raw); Holm: that p adjusted within the row (the family: the scheme's "
             f"{len(FACTORS)} factors; rows are not corrected against each other), whose marks it sets at "
             f"alpha = {alpha} († {reference} grows "
             "significantly less, ‡ the scheme does); exact: the two-sided sign-flip test of the growth gaps, no "
             "normality assumed (its floor is 2 / 2^n: 0.25 with 3 pairs, 0.0625 with 5).", ""]
    for (dataset, L), rows in groups.items():
        lines += [f"## {group_title(dataset, L)}", "",
                  "| scheme | pairs | gap at 1x | "
                  + " | ".join(f"gap at {k}x | growth gap to {k}x | < 0 | p | Holm | exact" for k in FACTORS)
                  + " |", "|---|---:|---:|" + "---:|" * 6 * len(FACTORS)]
        for row in rows:
            cells = []
            for k in FACTORS:
                if k not in row["growth"]:
                    cells += ["–"] * 6
                    continue
                test, growth = row["test"][k], row["growth"][k]
                cells += [_mean_std(row["gap"][k].values()), _mean_std(growth.values()),
                          f"{sum(v < 0 for v in growth.values())}/{len(growth)}", _p(test.p),
                          _p(test.p_adjusted) + test.mark, _p(test.exact_p)]
            n = max(len(g) for g in row["growth"].values())
            lines.append(f"| {row['scheme']} | {n} | {_mean_std(row['gap_1x'].values())} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)
