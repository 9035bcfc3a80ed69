"""Every figure the study's prose quotes, computed from the run records, with what it rests on.

The report (docs/results/README.md) is rendered from a template whose `{{name}}` placeholders are
filled from these claims, and claims.md lists each one: its value, n, what "±" is and the test
behind it. A placeholder without a claim is an error, so no figure can be typed by hand and no
figure can go stale: regenerate, and the prose follows the records.

Conventions of every claim:
- a gap is 100 (ppl_A / ppl_B - 1) in %, per seed pair (negative: A better), mean ± sample std
  (ddof = 1) over the pairs;
- a test is the paired two-sided t-test of Table 3 (stats.paired_test); where a claim reads a
  family (a scheme against kerple_log at every length of a group), the Holm-adjusted p is given
  beside the raw one (stats.holm), and the exact sign-flip p (stats.sign_flip_p), whose floor
  with n pairs is 2 / 2^n, beside both;
- runs of different train lengths share no pairing (a seed draws other batches at another
  length), so they are compared with the exact two-sample permutation test (stats.permutation_p).
"""
from __future__ import annotations

import math
import os
import re
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from megatron.evaluation.stats import holm, min_sign_flip_p, paired_test, permutation_p
from megatron.study.aggregate import table3_cells
from megatron.study.convergence import DRIFT_TARGET, drift_rows
from megatron.study.flat_kernels import FLAT_AT_L, head_values
from megatron.study.gap_vs_quality import fit as quality_fit
from megatron.study.gap_vs_quality import gap_quality_points
from megatron.study.growth import growth_rows
from megatron.study.train_length_quality import changes, quality_points
from megatron.study.train_test import _r, pairs
from megatron.study.trend import gap_points, slope

PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z0-9_]+)\s*\}\}")
LOG, POWER, ALIBI, T5, T5_128, ROTARY, SIN = ("kerple_log", "kerple_power_ap_", "alibi", "rpe (max distance L)", "rpe",
                                              "rotary", "sinusoidal")
PAPER_SIX = (LOG, POWER, ALIBI, T5, ROTARY, SIN)  # the schemes of the paper's Table 3 (T5: every bucket trained)
NAMES = {LOG: "KERPLE-log", POWER: "KERPLE-power", ALIBI: "ALiBi", T5: "T5", ROTARY: "rotary", SIN: "sinusoidal"}
DOMAINS = ("code", "latex", "web")  # v2's groups, train length 64
V2_L = 64


@dataclass(frozen=True)
class Claim:
    name: str
    value: str  # as the prose quotes it
    n: str  # what it is computed over
    spread: str  # what "±" is ("" without one)
    test: str  # the test behind it ("" for a description)
    source: str  # the generated table it can be checked in


class Claims(dict):
    def add(self, name: str, value, n: str = "", spread: str = "", test: str = "", source: str = "") -> None:
        if name in self:
            raise ValueError(f"claim {name!r} defined twice")
        self[name] = Claim(name, str(value), n, spread, test, source)


def _p(p: float) -> str:
    return "–" if p is None or math.isnan(p) else f"{p:.2g}"


def _pm(values, digits: int = 1, sign: bool = True) -> str:
    v = np.asarray(list(values), dtype=float)
    s = f"{v.mean():+.{digits}f}" if sign else f"{v.mean():.{digits}f}"
    return s + (f" ± {v.std(ddof=1):.{digits}f}" if v.size > 1 else "")


def _gap(a: float, b: float) -> float:
    return 100.0 * (a / b - 1.0)


def _words(n: int) -> str:
    return ("none", "one", "two", "three", "four", "five", "six")[n] if 0 <= n <= 6 else str(n)


class Study:
    """The records as lookups: perplexities by (dataset, train length, scheme) -> {seed: {length: ppl}}."""

    def __init__(self, runs, records):
        self.runs, self.records = runs, records
        self.ppl = defaultdict(dict)
        for r in runs:
            if r.train_length:
                self.ppl[(r.dataset, r.train_length, r.scheme)][r.seed] = r.ppl
        self.cells = {(c["dataset"], c["train_length"], c["scheme"], c["length"]): c for c in table3_cells(runs)}

    def row(self, d: str, L: int, scheme: str) -> list[dict]:
        """Table 3's tested cells of one scheme in one group, by length (the family of its Holm correction)."""
        return sorted((c for (dd, LL, s, _), c in self.cells.items() if (dd, LL, s) == (d, L, scheme)
                       and not math.isnan(c["p"])), key=lambda c: c["length"])

    def means(self, d: str, L: int, scheme: str, length: int, seeds=None) -> float:
        runs = self.ppl[(d, L, scheme)]
        return float(np.mean([runs[s][length] for s in (seeds or runs)]))

    def gaps(self, d: str, L: int, a: str, b: str, length: int) -> dict:
        A, B = self.ppl[(d, L, a)], self.ppl[(d, L, b)]
        return {s: _gap(A[s][length], B[s][length]) for s in sorted(set(A) & set(B), key=str)}


def row_summary(study: Study, d: str, L: int, scheme: str) -> str:
    """The Table 3 row against kerple_log: how many lengths are below 0.05 raw and after Holm, the p ranges."""
    row = study.row(d, L, scheme)
    raw = sum(c["p"] < 0.05 for c in row)
    adj = sum(c["p_holm"] < 0.05 for c in row)
    ps = [c["p"] for c in row]
    return (f"raw p {_p(min(ps))}-{_p(max(ps))}: below 0.05 at {raw} of {len(row)} lengths, and at {adj} of "
            f"{len(row)} after Holm's correction over the {len(row)}")


def order_claim(study: Study, d: str, L: int, length: int) -> tuple[str, str, list]:
    """(order by mean over each scheme's own seeds, order on the seeds all six share with each adjacent
    step's paired p, the shared seeds)."""
    schemes = [s for s in PAPER_SIX if (d, L, s) in study.ppl]
    own = sorted(schemes, key=lambda s: study.means(d, L, s, length))
    shared = sorted(set.intersection(*(set(study.ppl[(d, L, s)]) for s in schemes)), key=str)
    on_shared = sorted(schemes, key=lambda s: study.means(d, L, s, length, shared))
    text_own = " < ".join(f"{NAMES[s]} {study.means(d, L, s, length):.1f}" for s in own)
    steps = []
    for a, b in zip(on_shared, on_shared[1:]):
        t = paired_test({s: study.ppl[(d, L, b)][s][length] for s in shared},
                        {s: study.ppl[(d, L, a)][s][length] for s in shared})
        steps.append(f"{NAMES[a]} {study.means(d, L, a, length, shared):.1f} < (p = {_p(t.p)}) ")
    text_shared = "".join(steps) + f"{NAMES[on_shared[-1]]} {study.means(d, L, on_shared[-1], length, shared):.1f}"
    return text_own, text_shared, shared


def v2_claims(c: Claims, study: Study) -> None:
    src = "[table3.md](table3.md), [table3.csv](table3.csv)"
    for d in DOMAINS:
        L, top = V2_L, 32 * V2_L
        own, shared, seeds = order_claim(study, d, L, top)
        c.add(f"{d}_order_32x", own, "each scheme's own seeds (5 for kerple_log, ALiBi, KERPLE-power; 3 for T5, "
              "rotary, sinusoidal)", "", "none (an order of means)", src)
        c.add(f"{d}_order_32x_shared", shared, f"the {len(seeds)} seeds all six share ({', '.join(map(str, seeds))})",
              "", "paired t-test of each adjacent pair, raw p, no correction", src)
        alibi = study.row(d, L, ALIBI)
        gaps = [np.mean(list(study.gaps(d, L, ALIBI, LOG, x["length"]).values())) for x in alibi]
        c.add(f"{d}_alibi_gap", f"{min(gaps):+.1f} to {max(gaps):+.1f}%", f"{alibi[0]['n']} seed pairs, "
              f"{len(alibi)} lengths", "", "", src)
        c.add(f"{d}_alibi_tests", row_summary(study, d, L, ALIBI), f"{alibi[0]['n']} seed pairs per length", "",
              "paired t-test, Holm within the row", src)
        c.add(f"{d}_alibi_exact", _p(min(x["p_exact"] for x in alibi)), f"{alibi[0]['n']} pairs", "",
              f"exact sign-flip test (floor {min_sign_flip_p(alibi[0]['n']):.3g})", src)
        for scheme, key in ((POWER, "power"), (T5, "t5L"), (T5_128, "t5_128"), (ROTARY, "rotary"), (SIN, "sin"),
                            (f"{LOG} (window {L})", "window")):
            row = study.row(d, L, scheme)
            c.add(f"{d}_{key}_tests", row_summary(study, d, L, scheme), f"{row[0]['n']} seed pairs per length",
                  "", "paired t-test, Holm within the row", src)
            c.add(f"{d}_{key}_holm_lengths", ", ".join(f"{x['length'] // L}x" for x in row if x["p_holm"] < 0.05)
                  or "no length", f"{row[0]['n']} seed pairs", "", "Holm-adjusted p < 0.05 within the row", src)
        p32 = study.cells[(d, L, POWER, top)]
        c.add(f"{d}_power_32x", f"{p32['mean']:.1f} ± {p32['std']:.1f} against kerple_log's "
              f"{study.cells[(d, L, LOG, top)]['mean']:.1f} ± {study.cells[(d, L, LOG, top)]['std']:.1f} "
              f"(p = {_p(p32['p'])}, Holm {_p(p32['p_holm'])})", f"{p32['n']} seeds", "std over seeds",
              "paired t-test, Holm within the row", src)
        behind = [s for s in study.ppl[(d, L, POWER)] if s in study.ppl[(d, L, LOG)] and all(
            study.ppl[(d, L, POWER)][s][x] > study.ppl[(d, L, LOG)][s][x] for x in study.ppl[(d, L, LOG)][s])]
        c.add(f"{d}_power_behind_everywhere", f"{_words(len(behind))} of {p32['n']}", "seed pairs", "", "count",
              src)
        growth_claims(c, study, d, L, key=d)
        t5 = [study.cells[(d, L, s, top)] for s in (T5_128, T5)]
        c.add(f"{d}_t5_32x", f"{t5[0]['mean']:.1f} (max distance 128) -> {t5[1]['mean']:.1f} (max distance L), "
              f"kerple_log {study.means(d, L, LOG, top, t5[1]['seeds']):.1f} on the same seeds",
              f"{t5[1]['n']} seeds", "", "", src)


def growth_claims(c: Claims, study: Study, d: str, L: int, key: str) -> None:
    rows = {r["scheme"]: r for r in growth_rows(study.runs).get((d, L), [])}
    for scheme, name in ((POWER, "power"), (T5, "t5L")):
        if scheme not in rows or 32 not in rows[scheme]["growth"]:
            continue
        g, test = rows[scheme]["growth"][32], rows[scheme]["test"][32]
        neg = sum(v < 0 for v in g.values())
        c.add(f"{key}_{name}_growth", f"{_pm(g.values())}% ({neg} of {len(g)} pairs below 0; p = {_p(test.p)}, "
              f"Holm {_p(test.p_adjusted)}, exact {_p(test.exact_p)})", f"{len(g)} seed pairs",
              "std over seed pairs", "paired t-test of the growth ratios, Holm over 8x and 32x; exact sign-flip test",
              "[growth.md](growth.md)")


def power_growth_family(c: Claims, study: Study) -> None:
    """Power's growth gap to 32x against kerple_log in every group that has both: how many groups have it
    below 0 on the mean, and how many pass each test."""
    groups = [(k, rows) for k, rows in growth_rows(study.runs).items()
              for rows in [{r["scheme"]: r for r in rows}] if POWER in rows and 32 in rows[POWER]["growth"]]
    neg = sum(np.mean(list(r[POWER]["growth"][32].values())) < 0 for _, r in groups)
    raw = sum(r[POWER]["test"][32].p < 0.05 for _, r in groups)
    adj = [f"{d} L = {L}" for (d, L), r in groups if r[POWER]["test"][32].p_adjusted < 0.05]
    c.add("power_growth_groups", f"{neg} of {len(groups)}", "groups (dataset x train length) with both schemes",
          "", "mean growth gap to 32x below 0", "[growth.md](growth.md)")
    c.add("power_growth_groups_tests", f"raw p < 0.05 in {raw} of {len(groups)}, Holm-adjusted in {len(adj)} "
          f"({'; '.join(adj) or 'none'}), the exact sign-flip test in none (its floor with 3-5 pairs is "
          f"{min_sign_flip_p(5):.4g}-{min_sign_flip_p(3):.2g})", f"{len(groups)} groups, 3-5 seed pairs each", "",
          "paired t-test of the growth ratios per group, Holm over 8x and 32x", "[growth.md](growth.md)")
    rows = growth_rows(study.runs)
    pairs_v2 = [g for d in DOMAINS for row in rows[(d, V2_L)] if row["scheme"] == POWER
                for g in row["growth"][32].values()]
    c.add("power_growth_v2_pairs", f"{sum(v < 0 for v in pairs_v2)} of {len(pairs_v2)}",
          "seed pairs of v2's three domains at L = 64", "", "count (a description, no pooled test)",
          "[growth.md](growth.md)")


def web_claims(c: Claims, study: Study) -> None:
    tt = pairs(study.records)
    rows = tt[("web", V2_L)]
    c.add("web_train_test_r", f"r = {_r(rows):.3f} over {len(rows)} runs, {_r([x for x in rows if x[0] != SIN]):.3f} "
          f"without the {sum(x[0] == SIN for x in rows)} sinusoidal runs", f"{len(rows)} web runs", "", "Pearson r",
          "[train_test.md](train_test.md)")
    for d in ("code", "latex"):
        rows = tt[(d, V2_L)]
        c.add(f"{d}_train_test_r", f"{_r(rows):.3f} -> {_r([x for x in rows if x[0] != SIN]):.3f}",
              f"{len(rows)} runs", "", "Pearson r", "[train_test.md](train_test.md)")
    rise = {s: _pm([_gap(p[32 * V2_L], p[V2_L]) for p in study.ppl[("web", V2_L, s)].values()])
            for s in (LOG, ALIBI, T5, ROTARY, POWER, "xpos")}
    c.add("web_rise", ", ".join(f"{NAMES.get(s, s)} {v}%" for s, v in rise.items()), "each scheme's seeds",
          "std over seeds", "", "[table3.md](table3.md)")
    long = "web_long"
    for s, key in ((LOG, "log"), (f"{LOG} (window {V2_L})", "window"), (POWER, "power")):
        c.add(f"web_long_{key}_rise", _pm(_gap(p[32 * V2_L], p[V2_L]) for p in study.ppl[(long, V2_L, s)].values())
              + "%", f"{len(study.ppl[(long, V2_L, s)])} seeds", "std over seeds", "", "[table3.md](table3.md)")
    row = study.row(long, V2_L, f"{LOG} (window {V2_L})")
    c.add("web_long_window_tests", row_summary(study, long, V2_L, f"{LOG} (window {V2_L})"),
          f"{row[0]['n']} seed pairs per length", "", "paired t-test, Holm within the row", "[table3.md](table3.md)")
    for d, key in (("web", "all"), (long, "long")):
        g = study.gaps(d, V2_L, f"{LOG} (window {V2_L})", LOG, 32 * V2_L)
        g = {s: v for s, v in g.items() if s in study.ppl[(long, V2_L, LOG)]}
        c.add(f"web_window_gap_{key}", ", ".join(f"{v:+.1f}" for v in g.values()) + "%",
              f"seeds {', '.join(map(str, g))}", "", "", "[table3.md](table3.md)")


def drift_claims(c: Claims, study: Study) -> None:
    rows = [r for r in drift_rows(study.records) if r["dataset"] in DOMAINS and r["train_length"] == V2_L]
    total, over = sum(r["heads"] for r in rows), sum(r["over_target"] for r in rows)
    worst = max(rows, key=lambda r: r["max"])
    c.add("drift_under", f"{total - over} of {total}", "head-parameters (heads x seeds x {r1, r2}) of v2's three "
          "domains at L = 64", "", f"relative change over the last 20% of training below {DRIFT_TARGET:.0%}",
          "[drift.md](drift.md)")
    c.add("drift_worst", f"{worst['max']:.1%} ({worst['scheme']}, {worst['dataset']}, {worst['parameter']})",
          "the same head-parameters", "", "", "[drift.md](drift.md)")
    per = {d: (sum(r["heads"] - r["over_target"] for r in rows if r["dataset"] == d),
               sum(r["heads"] for r in rows if r["dataset"] == d)) for d in DOMAINS}
    c.add("drift_per_domain", ", ".join(f"{d} {a} of {b}" for d, (a, b) in per.items()), "", "", "",
          "[drift.md](drift.md)")


def flat_claims(c: Claims, study: Study) -> None:
    rows = head_values(study.records)
    flat = sum(r["flat"] for r in rows)
    c.add("flat_heads", f"{flat} of {len(rows)}", "KERPLE heads (kerple_log and kerple_power_ap_, every record)",
          "", f"f(L) >= -ln 2 = {FLAT_AT_L:.3f}", "[flat_kernels.md](flat_kernels.md)")
    log = [r for r in rows if r["scheme"] == LOG]
    c.add("flat_log_heads", f"{sum(r['flat'] for r in log)} of {len(log)}", "kerple_log heads x seeds, every record",
          "", f"f(L) >= -ln 2 = {FLAT_AT_L:.3f}", "[flat_kernels.md](flat_kernels.md)")
    where = defaultdict(list)
    for r in rows:
        if r["flat"]:
            where[(r["dataset"], r["train_length"], r["scheme"])].append(f"seed {r['seed']} head {r['head']}")
    c.add("flat_where", "; ".join(f"{d} L = {L} {s}: {', '.join(v)}" for (d, L, s), v in sorted(where.items()))
          or "none", "every flat head", "", "", "[flat_kernels.md](flat_kernels.md)")
    for d in DOMAINS:
        fl = max(r["f"][1] for r in log if r["dataset"] == d and r["train_length"] == V2_L)
        c.add(f"{d}_flattest_log", f"{fl:.2f}", "kerple_log heads x seeds", "", "", "[flat_kernels.md](flat_kernels.md)")
    best = max(log, key=lambda r: r["f"][1])
    c.add("flattest_log_any", f"{best['f'][1]:.2f} ({best['dataset']}, L = {best['train_length']})",
          "every kerple_log head of every record", "", "", "[flat_kernels.md](flat_kernels.md)")


def trend_claims(c: Claims, study: Study) -> None:
    gaps = gap_points(study.runs)
    for d in ("latex_warmup10", "code_warmup10", "latex_16seq", "code_16seq"):
        keys = [k for k in gaps if k[0] == d]
        slopes = {k: slope(gaps[k]["points"]) for k in keys}
        adjusted = dict(zip(keys, holm(math.nan if s is None else s[2] for s in slopes.values())))
        for (_, gap, k) in keys:
            name = {"windowed - full": "window", "power - log": "power", "alibi - log": "alibi"}[gap]
            pts, s = gaps[(d, gap, k)]["points"], slopes[(d, gap, k)]
            if s is None:
                continue
            c.add(f"{d}_{name}_{k}x", " / ".join(_pm(pts[L].values()) for L in sorted(pts)) + "% at L = "
                  + " / ".join(map(str, sorted(pts))) + f"; slope {s[0]:+.1f} ± {s[1]:.1f} per doubling "
                  f"(p = {_p(s[2])}, Holm {_p(adjusted[(d, gap, k)])})",
                  f"{min(len(v) for v in pts.values())}-{max(len(v) for v in pts.values())} seed pairs per L",
                  "gaps: std over seed pairs; slope: its standard error",
                  "least-squares slope over every (L, seed), Holm over the table's slopes", "[trend.md](trend.md)")
    q = quality_points(study.runs)
    for d in ("latex_warmup10", "code_warmup10"):
        parts = []
        for s in (LOG, POWER, ALIBI):
            by_L = q.get((d, s, 2048))
            if by_L:
                ch = changes(by_L)
                parts.append(f"{s} {_pm(ch[max(ch)])}%")
        c.add(f"{d}_quality_256", ", ".join(parts), "3 seeds, each against itself at L = 64",
              "std over seeds", "", "[trend.md](trend.md)")
    by_L = q.get(("latex_16seq", LOG, 2048))
    if by_L:
        ch = changes(by_L)
        c.add("latex_16seq_quality", " / ".join(f"{_pm(v)}%" for _, v in sorted(ch.items())) + " at L = "
              + " / ".join(map(str, sorted(ch))), "3 seeds against themselves at L = 64", "std over seeds", "",
              "[trend.md](trend.md)")


def quality_claims(c: Claims, study: Study) -> None:
    q = gap_quality_points(study.runs)
    for name, res in q.items():
        corpus = "latex" if "latex" in name else "code" if "code" in name else None
        if corpus is None:
            continue
        pts = res["points"].get(("windowed - full", 32), [])
        full = quality_fit(pts)
        if full is None:
            continue
        c.add(f"{corpus}_fit_32x", f"b = {full['b'][0]:+.2f} ± {full['b'][1]:.2f} per doubling of q (p = "
              f"{_p(full['b'][2])}), c = {full['c'][0]:+.2f} ± {full['c'][1]:.2f} per doubling of L (p = "
              f"{_p(full['c'][2])}); r(q, L) = {full['r(q, L)']:+.2f}", f"{full['n']} seed-paired gaps",
              "standard error", "least squares, t-test of each coefficient (no correction)", "[trend.md](trend.md)")
        if corpus == "latex":
            part = quality_fit([p for p in pts if p.dataset != "latex"])
            c.add("latex_fit_32x_without_warmup2", f"c = {part['c'][0]:+.2f} ± {part['c'][1]:.2f} (p = "
                  f"{_p(part['c'][2])}), b = {part['b'][0]:+.2f} ± {part['b'][1]:.2f} (p = {_p(part['b'][2])})",
                  f"{part['n']} gaps", "standard error", "least squares; a group left out after the fact",
                  "[trend.md](trend.md)")
    for corpus in ("latex", "code"):
        short = study.gaps(f"{corpus}_64seq", 64, f"{LOG} (window 64)", LOG, 32 * 64)
        long = study.gaps(f"{corpus}_16seq", 256, f"{LOG} (window 256)", LOG, 32 * 256)
        c.add(f"{corpus}_matched", f"L = 64: {', '.join(f'{v:+.2f}' for v in short.values())}%; L = 256: "
              f"{', '.join(f'{v:+.2f}' for v in long.values())}% (two-sample exact permutation p = "
              f"{_p(permutation_p(list(short.values()), list(long.values())))}, its floor with 3 and 3 runs)",
              f"{len(short)} and {len(long)} runs", "", "exact two-sample permutation test (no seed pairing "
              "across train lengths)", "[table3.md](table3.md)")
    ahead = {8: [], 32: []}
    n = 0
    for (d, L, s), runs in study.ppl.items():
        if s != LOG or (d, L, f"{LOG} (window {L})") not in study.ppl:
            continue
        win = study.ppl[(d, L, f"{LOG} (window {L})")]
        for seed in runs:
            if seed in win:
                n += 1
                for k in ahead:
                    if runs[seed].get(k * L, math.inf) < win[seed].get(k * L, -math.inf):
                        ahead[k].append((d, L, seed))
    c.add("full_ahead", f"{len(ahead[32])} of {n} runs at 32x and {len(ahead[8])} of {n} at 8x", "kerple_log runs with a "
          "windowed evaluation (every group)", "", "count", "[table3.csv](table3.csv)")


def count_claims(c: Claims, study: Study) -> None:
    recs = study.records
    v2 = [r for r in recs if str(r.get("config", "")).startswith("configs/repro_cpu_v2/")]
    c.add("n_records", len(recs), "record.json files in runs/", "", "", "[runs/](runs/)")
    c.add("n_v2", len(v2), "records whose config is under configs/repro_cpu_v2/", "", "", "[runs/](runs/)")
    c.add("n_v3", len(recs) - len(v2), "the other records (configs/repro_cpu_v3/)", "", "", "[runs/](runs/)")
    c.add("n_results", len(study.runs), "evaluations (full attention and windowed)", "", "", "[runs/](runs/)")


def study_claims(runs, records) -> Claims:
    c = Claims()
    study = Study(runs, records)
    count_claims(c, study)
    v2_claims(c, study)
    power_growth_family(c, study)
    web_claims(c, study)
    drift_claims(c, study)
    flat_claims(c, study)
    trend_claims(c, study)
    quality_claims(c, study)
    c.add("exact_floor_3", f"{min_sign_flip_p(3):.2g}", "3 pairs", "", "2 / 2^3", "")
    c.add("exact_floor_5", f"{min_sign_flip_p(5):.4g}", "5 pairs", "", "2 / 2^5", "")
    return c


def claims_markdown(claims: Claims) -> str:
    lines = ["# The report's figures, each from the records", "",
             "Every `{{name}}` of README.template.md, as README.md quotes it (megatron/study/claims.py). "
             "Gaps: 100 (ppl_A / ppl_B - 1) in %, per seed pair, negative: A better. Holm: the p adjusted "
             "within its family (the row of Table 3: one scheme against kerple_log at every length of a group). "
             "Exact: the sign-flip test, which with n pairs cannot go below 2 / 2^n.", "",
             "| name | value | n | ± | test | source |", "|---|---|---|---|---|---|"]
    for cl in claims.values():
        cells = [f"`{cl.name}`", cl.value, cl.n, cl.spread, cl.test, cl.source]
        lines.append("| " + " | ".join(x.replace("|", "\\|") for x in cells) + " |")
    return "\n".join(lines) + "\n"


def render(template: str, claims: Claims, where: str = "the template") -> str:
    """The template with every {{name}} replaced by its claim's value; ValueError naming every unknown one."""
    unknown = sorted({m.group(1) for m in PLACEHOLDER.finditer(template)} - set(claims))
    if unknown:
        raise ValueError(f"{where}: no claim named {', '.join(unknown)}; add it to megatron/study/claims.py "
                         "or fix the placeholder")
    return PLACEHOLDER.sub(lambda m: claims[m.group(1)].value, template)


TEMPLATES = {"README.md": "README.template.md", "summary": "summary.template.md"}  # output -> template file
BLOCK = ("<!-- study:summary:begin -->", "<!-- study:summary:end -->")  # the root README's generated paragraph


def report_texts(runs, records, template_dir: str) -> dict[str, str]:
    """{"README.md": the report, "claims.md": the claims table, "summary": the root README's paragraph},
    each rendered from the templates in template_dir."""
    claims = study_claims(runs, records)
    out = {"claims.md": claims_markdown(claims)}
    for name, template in TEMPLATES.items():
        path = os.path.join(template_dir, template)
        try:
            with open(path) as f:
                text = f.read()
        except OSError as e:
            raise ValueError(f"{path}: cannot read the report's template ({e.strerror}); give --templates DIR "
                             "holding README.template.md and summary.template.md") from e
        out[name] = render(text, claims, path)
    return out


def with_block(text: str, block: str, path: str) -> str:
    """text with the part between BLOCK's two markers replaced by block; ValueError without the markers."""
    begin, end = BLOCK
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < i:
        raise ValueError(f"{path}: no '{begin}' ... '{end}' block to write the study's summary into; add the two "
                         "marker lines where it belongs")
    return text[:i + len(begin)] + "\n" + block.rstrip("\n") + "\n" + text[j:]
