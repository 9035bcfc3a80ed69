"""Every figure the study's prose quotes, computed from the run records, with what it rests on.

The report (docs/results/README.md) is rendered from a template whose `{{name}}` placeholders are
filled from these claims, and claims.md lists each one: its value, n, what "±" is and the test
behind it. A placeholder without a claim is an error, so no figure can be typed by hand and no
figure can go stale: regenerate, and the prose follows the records.

Conventions of every claim:
- a gap is 100 (ppl_A / ppl_B - 1) in %, per seed pair (negative: A better), mean ± sample std
  (ddof = 1) over the pairs;
- a test is the paired two-sided t-test of Table 3 (stats.paired_test) on perplexity, the quantity
  Table 3 prints (so it tests the difference of the means its cells show); where a claim reads a
  family (a scheme against kerple_log at every length of a group), the Holm-adjusted p is given
  beside the raw one (stats.holm), and the exact sign-flip p (stats.sign_flip_p), whose floor
  with n pairs is 2 / 2^n, beside both. The same tests on log-perplexity (the scale of the ratio
  gaps) are the check (log_scale_claims);
- runs of different train lengths share no pairing (a seed draws other batches at another
  length): they are compared by least-squares slopes over every (L, seed) and by the fit of
  gap_vs_quality (± is then the standard error, and the p that of the coefficient's t-test), and
  the quality-matched point by the exact two-sample permutation test (stats.permutation_p);
- a configuration trained twice under two group names (replicates.py) counts once where groups
  are counted or fitted.
"""
from __future__ import annotations

import math
import os
import re
from collections import defaultdict
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats as sps

from megatron.evaluation.stats import holm, min_sign_flip_p, paired_test, permutation_p
from study.aggregate import order_schemes, table3_cells
from study.convergence import DRIFT_TARGET, drift_rows
from study.flat_kernels import FLAT_AT_L, head_values
from study.gap_vs_quality import count_once, gap_quality_points, leave_one_group_out
from study.gap_vs_quality import fit as quality_fit
from study.growth import growth_rows
from study.paper_claims import CLAIMS as PAPER_CLAIMS
from study.paper_claims import Records, cell_text, context_tests, verdicts
from study.replicates import identities, replicate_differences, trained_as
from study.same_context import split_rows
from study.schemes import ALIBI, DOMAINS, LOG, NAMES, PAPER_SIX, POWER, ROTARY, SIN, T5, T5_128, V2_L
from study.train_length_quality import changes, quality_points
from study.train_test import _r, pairs
from study.trend import gap_points, slope

PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z0-9_]+)\s*\}\}")


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


def log_runs(runs) -> list:
    """The runs with every perplexity replaced by its log (the mean loss in nats): Table 3's tests on this
    scale test the ratio of two perplexities, the scale of the report's gaps."""
    return [replace(r, ppl={L: math.log(v) for L, v in r.ppl.items()}) for r in runs]


class Study:
    """The records as lookups: perplexities by (dataset, train length, scheme) -> {seed: {length: ppl}};
    Table 3's cells on perplexity (cells) and on log-perplexity (log_cells); identity: what each run
    trained (replicates.identities, from the configs under config_root; {} without one)."""

    def __init__(self, runs, records, config_root: str | None = None):
        self.runs, self.records = runs, records
        self.ppl = defaultdict(dict)
        for r in runs:
            if r.train_length:
                self.ppl[(r.dataset, r.train_length, r.scheme)][r.seed] = r.ppl
        self.cells = {(c["dataset"], c["train_length"], c["scheme"], c["length"]): c for c in table3_cells(runs)}
        self.log_cells = {(c["dataset"], c["train_length"], c["scheme"], c["length"]): c
                          for c in table3_cells(log_runs(runs))}
        self.identity = identities(records, config_root) if config_root else {}
        self.record = {(r["dataset"], r["train_length"], r["label"], r["seed"]): r for r in records}
        self.paper = Records(runs)  # the lookups of the table against the paper's claims (paper_claims.py)

    def row(self, d: str, L: int, scheme: str, log: bool = False) -> list[dict]:
        """Table 3's tested cells of one scheme in one group, by length (the family of its Holm correction);
        log: the same tests on log-perplexity."""
        cells = self.log_cells if log else self.cells
        return sorted((c for (dd, LL, s, _), c in cells.items() if (dd, LL, s) == (d, L, scheme)
                       and not math.isnan(c["p"])), key=lambda c: c["length"])

    def means(self, d: str, L: int, scheme: str, length: int, seeds=None) -> float:
        runs = self.ppl[(d, L, scheme)]
        return float(np.mean([runs[s][length] for s in (seeds or runs)]))

    def gaps(self, d: str, L: int, a: str, b: str, length: int) -> dict:
        A, B = self.ppl[(d, L, a)], self.ppl[(d, L, b)]
        return {s: _gap(A[s][length], B[s][length]) for s in sorted(set(A) & set(B), key=str)}


def row_summary(study: Study, d: str, L: int, scheme: str, log: bool = False) -> str:
    """The Table 3 row against kerple_log: how many lengths are below 0.05 raw and after Holm, the p ranges."""
    row = study.row(d, L, scheme, log)
    raw = sum(c["p"] < 0.05 for c in row)
    adj = sum(c["p_holm"] < 0.05 for c in row)
    ps = [c["p"] for c in row]
    return (f"raw p {_p(min(ps))}-{_p(max(ps))}: below 0.05 at {raw} of {len(row)} lengths, and at {adj} of "
            f"{len(row)} after Holm's correction over the {len(row)}")


def holm_lengths(row: list[dict], L: int) -> str:
    return ", ".join(f"{x['length'] // L}x" for x in row if x["p_holm"] < 0.05) or "no length"


def order_claim(study: Study, d: str, L: int, length: int) -> dict:
    """own: the order by mean over each scheme's own seeds; shared: the order on the seeds all six share
    with each adjacent step's paired p; order: the schemes in that order; steps: the adjacent steps' p;
    seeds: the shared seeds."""
    schemes = [s for s in PAPER_SIX if (d, L, s) in study.ppl]
    own = sorted(schemes, key=lambda s: study.means(d, L, s, length))
    shared = sorted(set.intersection(*(set(study.ppl[(d, L, s)]) for s in schemes)), key=str)
    on_shared = sorted(schemes, key=lambda s: study.means(d, L, s, length, shared))
    text_own = " < ".join(f"{NAMES[s]} {study.means(d, L, s, length):.1f}" for s in own)
    steps, ps = [], []
    for a, b in zip(on_shared, on_shared[1:]):
        t = paired_test({s: study.ppl[(d, L, b)][s][length] for s in shared},
                        {s: study.ppl[(d, L, a)][s][length] for s in shared})
        ps.append(t.p)
        steps.append(f"{NAMES[a]} {study.means(d, L, a, length, shared):.1f} < (p = {_p(t.p)}) ")
    text_shared = "".join(steps) + f"{NAMES[on_shared[-1]]} {study.means(d, L, on_shared[-1], length, shared):.1f}"
    return {"own": text_own, "shared": text_shared, "order": on_shared, "steps": ps, "seeds": shared}


def v2_claims(c: Claims, study: Study) -> None:
    src = "[table3.md](table3.md), [table3.csv](table3.csv)"
    orders = {}
    for d in DOMAINS:
        L, top = V2_L, 32 * V2_L
        o = orders[d] = order_claim(study, d, L, top)
        c.add(f"{d}_order_32x", o["own"], "each scheme's own seeds (5 for kerple_log, ALiBi, KERPLE-power; 3 for T5, "
              "rotary, sinusoidal)", "", "none (an order of means)", src)
        c.add(f"{d}_order_32x_shared", o["shared"], f"the {len(o['seeds'])} seeds all six share "
              f"({', '.join(map(str, o['seeds']))})", "", "paired t-test of each adjacent pair, raw p, no correction", src)
        alibi = study.row(d, L, ALIBI)
        gaps = [np.mean(list(study.gaps(d, L, ALIBI, LOG, x["length"]).values())) for x in alibi]
        c.add(f"{d}_alibi_gap", f"{min(gaps):+.1f} to {max(gaps):+.1f}%", f"{alibi[0]['n']} seed pairs, "
              f"{len(alibi)} lengths", "", "", src)
        largest = alibi[int(np.argmax(gaps))]["length"] // L
        c.add(f"{d}_alibi_lead_shape", f"{gaps[0]:+.1f}% at 1x -> {gaps[-1]:+.1f}% at 32x, largest at {largest}x",
              f"{alibi[0]['n']} seed pairs per length", "", "mean gap of ALiBi against kerple_log per length "
              "(a description; the growth gap is its test)", src)
        c.add(f"{d}_alibi_tests", row_summary(study, d, L, ALIBI), f"{alibi[0]['n']} seed pairs per length", "",
              "paired t-test, Holm within the row", src)
        c.add(f"{d}_alibi_exact", _p(min(x["p_exact"] for x in alibi)), f"{alibi[0]['n']} pairs", "",
              f"exact sign-flip test (floor {min_sign_flip_p(alibi[0]['n']):.3g})", src)
        for scheme, key in ((POWER, "power"), (T5, "t5L"), (T5_128, "t5_128"), (ROTARY, "rotary"), (SIN, "sin"),
                            (f"{LOG} (window {L})", "window")):
            row = study.row(d, L, scheme)
            c.add(f"{d}_{key}_tests", row_summary(study, d, L, scheme), f"{row[0]['n']} seed pairs per length",
                  "", "paired t-test, Holm within the row", src)
            c.add(f"{d}_{key}_holm_lengths", holm_lengths(row, L), f"{row[0]['n']} seed pairs", "",
                  "Holm-adjusted p < 0.05 within the row", src)
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
    order_family(c, study, orders)
    ahead = [(d, x["length"]) for d in DOMAINS for x in study.row(d, V2_L, ALIBI)
             if np.mean(list(study.gaps(d, V2_L, ALIBI, LOG, x["length"]).values())) > 0]
    c.add("alibi_behind_everywhere", f"{len(ahead)} of {sum(len(study.row(d, V2_L, ALIBI)) for d in DOMAINS)}",
          "(domain, length) cells of v2 at L = 64, 5 seed pairs each", "", "count of cells where ALiBi's mean gap "
          "to kerple_log is above 0 (a description)", src)


def order_family(c: Claims, study: Study, orders: dict) -> None:
    """What the three shared-seed orders have in common, against the paper's order (PAPER_SIX)."""
    src = "[table3.md](table3.md)"
    paper = [s for s in PAPER_SIX]
    same = [d for d, o in orders.items() if o["order"] == paper]
    firsts = sorted({NAMES[o["order"][0]] for o in orders.values()})
    c.add("order_vs_paper", f"the paper's in {len(same)} of {len(orders)} domains"
          + (f" ({', '.join(same)})" if same else "") + f"; first: {' / '.join(firsts)}"
          + (" in all three" if len(firsts) == 1 else ""), "the seeds all six share, per domain", "",
          "none (an order of means)", src)
    steps = [p for o in orders.values() for p in o["steps"]]
    c.add("order_steps_below_005", f"{sum(p < 0.05 for p in steps)} of {len(steps)}",
          f"adjacent steps of the {len(orders)} shared-seed orders", "", "paired t-test, raw p < 0.05, no correction",
          src)
    tops = {d: frozenset(o["order"][-2:]) for d, o in orders.items()}
    top = set.intersection(*map(set, tops.values()))
    c.add("top_two_32x", (" and ".join(NAMES[s] for s in PAPER_SIX if s in top) + " in all three domains") if len(top) == 2
          else "not the same two schemes in every domain", "the 32x means on the shared seeds", "",
          "none (an order of means)", src)
    parts = []
    for d, o in orders.items():
        seeds, top_len = o["seeds"], 32 * V2_L
        t = paired_test({s: study.ppl[(d, V2_L, T5)][s][top_len] for s in seeds},
                        {s: study.ppl[(d, V2_L, ALIBI)][s][top_len] for s in seeds})
        parts.append(f"{d} p = {_p(t.p)}")
    c.add("alibi_t5_p", ", ".join(parts), "the seeds all six share, per domain", "",
          "paired t-test of ALiBi against T5 (every bucket trained) at 32x, raw p", src)


def growth_claims(c: Claims, study: Study, d: str, L: int, key: str) -> None:
    rows = {r["scheme"]: r for r in growth_rows(study.runs).get((d, L), [])}
    for scheme, name in ((POWER, "power"), (T5, "t5L"), (ALIBI, "alibi")):
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
    below 0 on the mean, and how many pass each test; groups whose runs trained the same configs as another
    group's are named (one configuration, measured twice)."""
    groups = [(k, rows) for k, rows in growth_rows(study.runs).items()
              for rows in [{r["scheme"]: r for r in rows}] if POWER in rows and 32 in rows[POWER]["growth"]]
    neg = sum(np.mean(list(r[POWER]["growth"][32].values())) < 0 for _, r in groups)
    raw = sum(r[POWER]["test"][32].p < 0.05 for _, r in groups)
    exact = sum(r[POWER]["test"][32].exact_p < 0.05 for _, r in groups)
    adj = [f"{d} L = {L}" for (d, L), r in groups if r[POWER]["test"][32].p_adjusted < 0.05]
    trained = defaultdict(list)  # what a group's compared runs trained -> the groups
    for (d, L), r in groups:
        trained[frozenset(trained_as(study.identity, d, L, s, seed) for s in (LOG, POWER)
                          for seed in r[POWER]["growth"][32])].append(f"{d} L = {L}")
    twice = [" and ".join(g) for g in trained.values() if len(g) > 1]
    c.add("power_growth_groups", f"{neg} of {len(groups)} groups" + (f" ({len(trained)} distinct configurations: "
          f"{'; '.join(twice)} trained the same ones)" if twice else ""),
          "groups (dataset x train length) with both schemes", "", "mean growth gap to 32x below 0",
          "[growth.md](growth.md)")
    ns = sorted({len(r[POWER]["growth"][32]) for _, r in groups})
    c.add("power_growth_groups_tests", f"raw p < 0.05 in {raw} of {len(groups)}, Holm-adjusted in {len(adj)} "
          f"({'; '.join(adj) or 'none'}), the exact sign-flip test in {_words(exact)} (its floor: "
          + ", ".join(f"{min_sign_flip_p(n):.4g} with {n} pairs" for n in ns) + ")",
          f"{len(groups)} groups, {ns[0]}-{ns[-1]} seed pairs each", "",
          "paired t-test of the growth ratios per group, Holm over 8x and 32x", "[growth.md](growth.md)")
    rows = growth_rows(study.runs)
    pairs_v2 = [g for d in DOMAINS for row in rows[(d, V2_L)] if row["scheme"] == POWER
                for g in row["growth"][32].values()]
    c.add("power_growth_v2_pairs", f"{sum(v < 0 for v in pairs_v2)} of {len(pairs_v2)}",
          "seed pairs of v2's three domains at L = 64", "", "count (a description, no pooled test)",
          "[growth.md](growth.md)")


def extrapolation_claims(c: Claims, study: Study) -> None:
    """The paper's core claim: beyond the train length, perplexity does not rise (it falls as the longer
    windows give more context). Per domain and scheme, each seed's change from 1x to 32x, and the paired
    t-test of ppl(32L) against ppl(L), Holm over the family of every scheme and domain listed."""
    keys = [(d, s) for d in DOMAINS for s in (LOG, ALIBI, POWER)]
    tests = {}
    for d, s in keys:
        runs = study.ppl[(d, V2_L, s)]
        tests[(d, s)] = paired_test({seed: p[V2_L] for seed, p in runs.items()},
                                    {seed: p[32 * V2_L] for seed, p in runs.items()})
    adjusted = dict(zip(keys, holm(tests[k].p for k in keys)))
    test = (f"paired t-test of ppl(32L) against ppl(L), Holm over the {len(keys)} (3 schemes x 3 domains); "
            "exact sign-flip test")
    for d in DOMAINS:
        parts = []
        for s, key in ((LOG, "log"), (ALIBI, "alibi"), (POWER, "power")):
            runs = study.ppl[(d, V2_L, s)]
            change = [_gap(p[32 * V2_L], p[V2_L]) for p in runs.values()]
            t = tests[(d, s)]
            text = (f"{_pm(change)}% ({sum(v < 0 for v in change)} of {len(change)} seeds lower; "
                    f"p = {_p(t.p)}, Holm {_p(adjusted[(d, s)])}, exact {_p(t.exact_p)})")
            c.add(f"{d}_{key}_32x_vs_1x", text, f"{len(change)} seeds", "std over seeds", test, "[table3.md](table3.md)")
            parts.append(f"{NAMES[s]} {text}")
        c.add(f"{d}_ppl_32x_vs_1x", "; ".join(parts), "each scheme's seeds", "std over seeds", test,
              "[table3.md](table3.md)")
    for d in DOMAINS:
        lower = [(s, seed) for s in (LOG, ALIBI, POWER) for seed, p in study.ppl[(d, V2_L, s)].items()
                 if p[32 * V2_L] < p[V2_L]]
        n = sum(len(study.ppl[(d, V2_L, s)]) for s in (LOG, ALIBI, POWER))
        c.add(f"{d}_ppl_32x_lower", f"{len(lower)} of {n}", "runs of KERPLE-log, ALiBi and KERPLE-power", "",
              "count of runs whose perplexity at 32x is below their own at 1x", "[table3.md](table3.md)")


def log_scale_claims(c: Claims, study: Study) -> None:
    """Table 3's tests on log-perplexity beside the ones on perplexity: per row (a scheme against kerple_log
    in one group), how many lengths are Holm-significant on each scale, and the rows where they differ."""
    rows = sorted({k[:3] for k, cell in study.cells.items() if not math.isnan(cell["p"])}, key=str)
    differ = []
    for d, L, s in rows:
        a = sum(x["p_holm"] < 0.05 for x in study.row(d, L, s))
        b = sum(x["p_holm"] < 0.05 for x in study.row(d, L, s, log=True))
        if a != b:
            differ.append(f"{d} L = {L} {s} ({a} -> {b} of {len(study.row(d, L, s))})")
    c.add("log_scale_check", f"the same count of Holm-significant lengths in {len(rows) - len(differ)} of {len(rows)} "
          f"rows; it differs (perplexity -> log-perplexity) in {'; '.join(differ) or 'none'}",
          "every tested row of Table 3", "", "paired t-test on log-perplexity, Holm within the row, against the "
          "same on perplexity", "[table3.csv](table3.csv) (perplexity scale)")
    for d in DOMAINS:
        row = study.row(d, V2_L, SIN, log=True)
        if not row:
            continue
        c.add(f"{d}_sin_log_holm_lengths", holm_lengths(row, V2_L), f"{row[0]['n']} seed pairs", "",
              "paired t-test on log-perplexity, Holm within the row", "")


def web_claims(c: Claims, study: Study) -> None:
    tt = pairs(study.records)
    rows = tt[("web", V2_L)]
    r_all, r_sin = _r(rows), _r([x for x in rows if x[0] != SIN])
    c.add("web_train_test_r", f"r = {r_all:.3f} (r² = {r_all ** 2:.2f}) over {len(rows)} runs, {r_sin:.3f} "
          f"(r² = {r_sin ** 2:.2f}) without the {sum(x[0] == SIN for x in rows)} sinusoidal runs",
          f"{len(rows)} web runs", "", "Pearson r (r²: the share of the variance of the test perplexity it accounts "
          "for in a straight line)", "[train_test.md](train_test.md)")
    for d in ("code", "latex"):
        rows = tt[(d, V2_L)]
        c.add(f"{d}_train_test_r", f"{_r(rows):.3f} -> {_r([x for x in rows if x[0] != SIN]):.3f}",
              f"{len(rows)} runs", "", "Pearson r", "[train_test.md](train_test.md)")
    schemes = [s for s in order_schemes({s for d, L, s in study.ppl if (d, L) == ("web", V2_L)}, LOG)
               if "(window" not in s]
    rise = {s: [_gap(p[32 * V2_L], p[V2_L]) for p in study.ppl[("web", V2_L, s)].values()] for s in schemes}
    c.add("web_rise", ", ".join(f"{NAMES.get(s, s)} {_pm(v)}%" for s, v in rise.items()), "each scheme's seeds",
          "std over seeds", "", "[table3.md](table3.md)")
    c.add("web_rise_count", f"{sum(np.mean(v) > 0 for v in rise.values())} of {len(rise)}",
          "full-attention schemes of web at L = 64", "", "count of schemes whose mean change from 1x to 32x is above 0 "
          "(a description)", "[table3.md](table3.md)")
    long = "web_long"
    for s, key in ((LOG, "log"), (f"{LOG} (window {V2_L})", "window"), (POWER, "power")):
        c.add(f"web_long_{key}_rise", _pm(_gap(p[32 * V2_L], p[V2_L]) for p in study.ppl[(long, V2_L, s)].values())
              + "%", f"{len(study.ppl[(long, V2_L, s)])} seeds", "std over seeds", "", "[table3.md](table3.md)")
    window = f"{LOG} (window {V2_L})"
    row = study.row(long, V2_L, window)
    c.add("web_long_window_tests", row_summary(study, long, V2_L, window),
          f"{row[0]['n']} seed pairs per length", "", "paired t-test, Holm within the row", "[table3.md](table3.md)")
    c.add("web_long_window_holm_lengths", holm_lengths(row, V2_L), f"{row[0]['n']} seed pairs", "",
          "Holm-adjusted p < 0.05 within the row", "[table3.md](table3.md)")
    docs = sorted({r.corpus[4] for r in study.runs if r.dataset == long and len(r.corpus) > 4 and r.corpus[4]})
    c.add("web_long_docs", " / ".join(f"{x:,}" for x in docs) or "–", "the web_long evaluations", "", "",
          "[table3.md](table3.md)")
    top = study.cells[(long, V2_L, window, 32 * V2_L)]
    c.add("web_long_window_32x", f"raw p {_p(top['p'])}, Holm {_p(top['p_holm'])}, exact {_p(top['p_exact'])} "
          f"(its floor with {top['n']} pairs: {min_sign_flip_p(top['n']):.2g})", f"{top['n']} seed pairs",
          "", "paired t-test, Holm within the row; exact sign-flip test", "[table3.csv](table3.csv)")
    for d, key in (("web", "all"), (long, "long")):
        g = study.gaps(d, V2_L, window, LOG, 32 * V2_L)
        g = {s: v for s, v in g.items() if s in study.ppl[(long, V2_L, LOG)]}
        c.add(f"web_window_gap_{key}", ", ".join(f"{v:+.1f}" for v in g.values()) + "%",
              f"seeds {', '.join(map(str, g))}", "", "", "[table3.md](table3.md)")
    same, other = [], []
    for seed in sorted(study.ppl[(long, V2_L, LOG)], key=str):
        a, b = (study.record.get((d, V2_L, LOG, seed)) for d in ("web", long))
        if a and b:
            (same if a["trajectory"].get("lm_loss") == b["trajectory"].get("lm_loss") else other).append(str(seed))
    c.add("web_long_retrained", (f"seed{'s' if len(other) > 1 else ''} {', '.join(other)} "
          f"{'differ' if len(other) > 1 else 'differs'} from the all-document run of the same seed"
          if other else "no seed differs") + (f"; seed{'s' if len(same) > 1 else ''} {', '.join(same)} "
          "trained identically" if same else ""), f"the {len(same) + len(other)} web_long kerple_log runs",
          "", "the training loss at every logged step, compared with web's kerple_log run of the same seed",
          "[runs/](runs/)")


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
    v3 = [r for r in drift_rows(study.records) if not (r["dataset"] in DOMAINS and r["train_length"] == V2_L)]
    if v3:
        total, over = sum(r["heads"] for r in v3), sum(r["over_target"] for r in v3)
        worst = max(v3, key=lambda r: r["max"])
        c.add("drift_v3", f"{over} of {total} head-parameters moved more than {DRIFT_TARGET:.0%} (the largest "
              f"{worst['max']:.1%}: {worst['scheme']}, {worst['dataset']} L = {worst['train_length']}, "
              f"{worst['parameter']})", "head-parameters (heads x seeds x parameters) of every group but v2's three "
              "at L = 64: the groups of v3's slopes and fits", "",
              f"relative change over the last 20% of training above {DRIFT_TARGET:.0%}", "[drift.md](drift.md)")


def flat_claims(c: Claims, study: Study) -> None:
    rows = head_values(study.records)
    once = "a head of a configuration trained twice (replicates.py) counted once, flat when its mean f(L) is"
    flat, heads = flat_once(study, rows)
    c.add("flat_heads", f"{flat} of {heads}", "distinct KERPLE heads (kerple_log and kerple_power_ap_, every record; "
          f"{len(rows)} with the replicate runs' heads counted twice)", "", f"{once} >= -ln 2 = {FLAT_AT_L:.3f}",
          "[flat_kernels.md](flat_kernels.md)")
    log = [r for r in rows if r["scheme"] == LOG]
    flat, heads = flat_once(study, log)
    c.add("flat_log_heads", f"{flat} of {heads}", f"distinct kerple_log heads x seeds, every record ({len(log)} with "
          "the replicate runs' heads counted twice)", "", f"{once} >= -ln 2 = {FLAT_AT_L:.3f}",
          "[flat_kernels.md](flat_kernels.md)")
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


def flat_once(study: Study, rows: list[dict]) -> tuple[int, int]:
    """(flat heads, heads) with each (configuration, head) counted once: a configuration trained under two
    group names (replicates.py) is one model measured twice, so its head is one head, flat when the mean of
    its runs' f(L) is."""
    by = defaultdict(list)
    for r in rows:
        by[(trained_as(study.identity, r["dataset"], r["train_length"], r["scheme"], r["seed"]), r["head"])].append(
            r["f"][1])
    return sum(float(np.mean(v)) >= FLAT_AT_L for v in by.values()), len(by)


def slope_ci(points: dict, s: tuple, level: float = 0.95) -> tuple[float, float]:
    """The confidence interval of a trend slope (trend.slope's (slope, se, p)): slope ± t(n - 2) se."""
    n = sum(len(v) for v in points.values())
    half = float(sps.t.ppf(0.5 + level / 2, n - 2)) * s[1]
    return s[0] - half, s[0] + half


def tight(points: dict, s: tuple) -> bool:
    """Whether the slope's 95% interval, carried over the design's span of doublings, excludes both the
    first train length's gap vanishing and doubling: a trend that small or smaller is shown absent."""
    Ls = sorted(points)
    g0 = float(np.mean(list(points[Ls[0]].values())))
    span = math.log2(Ls[-1] / Ls[0])
    lo, hi = slope_ci(points, s)
    return -abs(g0) < lo * span and hi * span < abs(g0)


def narrowing_wording(slope_value: float, first_gap: float, p_all: float, n_all: int, p_table: float,
                      n_table: int) -> str:
    """How the report may state that a gap narrows with L: shown only when its slope survives Holm's correction
    over all the slopes it was chosen from (n_all); the correction within its own table (n_table) is given
    beside, never the ground. Narrowing: the slope moves the gap toward 0 from its value at the shortest L."""
    beside = f"Holm p {_p(p_all)} over all {n_all}; {_p(p_table)} within its own table of {n_table}"
    if not p_all < 0.05:
        return f"not shown after correcting for {n_all} slopes ({beside})"
    if (slope_value > 0) != (first_gap > 0):
        return f"shown after correcting for {n_all} slopes ({beside})"
    return f"contradicted after correcting for {n_all} slopes: the gap widens ({beside})"


def trend_claims(c: Claims, study: Study) -> None:
    gaps = gap_points(study.runs)
    everywhere = {k: slope(g["points"]) for k, g in gaps.items()}
    everywhere = {k: v for k, v in everywhere.items() if v is not None}
    all_holm = dict(zip(everywhere, holm(v[2] for v in everywhere.values())))
    best = min(all_holm, key=all_holm.get)
    c.add("trend_all_slopes", f"the smallest Holm-adjusted p over all {len(all_holm)} slopes of trend.md is "
          f"{_p(all_holm[best])} ({best[0]}, {best[1]}, {best[2]}x)", f"{len(all_holm)} slopes", "",
          "least-squares slope's t-test, Holm over every slope of trend.md at once", "[trend.md](trend.md)")
    names = {"windowed - full": "window", "power - log": "power", "alibi - log": "alibi"}
    verdicts, raw = {True: [], False: []}, []
    for d in ("latex_warmup10", "code_warmup10", "latex_16seq", "code_16seq"):
        keys = [k for k in gaps if k[0] == d]
        slopes = {k: slope(gaps[k]["points"]) for k in keys}
        adjusted = dict(zip(keys, holm(math.nan if s is None else s[2] for s in slopes.values())))
        family = sum(s is not None for s in slopes.values())
        for (_, gap, k) in keys:
            pts, s = gaps[(d, gap, k)]["points"], slopes[(d, gap, k)]
            if s is None:
                continue
            lo, hi = slope_ci(pts, s)
            c.add(f"{d}_{names[gap]}_{k}x", " / ".join(_pm(pts[L].values()) for L in sorted(pts)) + "% at L = "
                  + " / ".join(map(str, sorted(pts))) + f"; slope {s[0]:+.1f} ± {s[1]:.1f} (SE) per doubling, 95% CI "
                  f"{lo:+.1f} to {hi:+.1f} (p = {_p(s[2])}, Holm {_p(adjusted[(d, gap, k)])} over the {family} slopes "
                  "of its table)",
                  f"{min(len(v) for v in pts.values())}-{max(len(v) for v in pts.values())} seed pairs per L, "
                  f"{sum(len(v) for v in pts.values())} points",
                  "gaps: std over seed pairs; slope: its standard error",
                  "least-squares slope over every (L, seed), t-test; Holm over the table's slopes",
                  "[trend.md](trend.md)")
            c.add(f"{d}_{names[gap]}_{k}x_slope", f"slope {s[0]:+.1f} ± {s[1]:.1f} (SE) per doubling of L, 95% CI "
                  f"{lo:+.1f} to {hi:+.1f} (p = {_p(s[2])}, Holm {_p(adjusted[(d, gap, k)])} over the {family} slopes of "
                  "its table)", f"{sum(len(v) for v in pts.values())} (L, seed) points", "standard error",
                  "least-squares slope, t-test; Holm over the table's slopes", "[trend.md](trend.md)")
            if gap == "windowed - full" and k == 32:
                first = float(np.mean(list(pts[min(pts)].values())))
                c.add(f"{d}_window_32x_narrowing", narrowing_wording(s[0], first, all_holm[(d, gap, k)], len(all_holm),
                                                                     adjusted[(d, gap, k)], family),
                      f"{sum(len(v) for v in pts.values())} (L, seed) points", "",
                      f"the slope's t-test, Holm over all {len(all_holm)} slopes of trend.md (the slopes it was "
                      "chosen from) decides; Holm within its own table given beside", "[trend.md](trend.md)")
            if d.endswith("_warmup10") and k == 32 and gap in ("windowed - full", "power - log"):
                verdicts[tight(pts, s)].append(f"{d.split('_')[0].replace('latex', 'LaTeX')} {gap}")
                raw.append(s[2])
    c.add("equal_tokens_tight", f"the 95% CI rules out the L = 64 gap vanishing or doubling by L = 256 for "
          f"{', '.join(verdicts[True]) or 'none'}, not for {', '.join(verdicts[False]) or 'none'}",
          "the equal-token slopes at 32x", "",
          "tight: the 95% CI of the slope, times the two doublings from L = 64 to 256, excludes both the gap at "
          "L = 64 vanishing and doubling", "[trend.md](trend.md)")
    c.add("equal_tokens_below_005", _words(sum(p < 0.05 for p in raw)),
          f"the {len(raw)} equal-token slopes at 32x (windowed and power - log, both corpora)", "",
          "raw p < 0.05 of the slope's t-test",
          "[trend.md](trend.md)")
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


def _fit_text(f: dict) -> str:
    return (f"b = {f['b'][0]:+.2f} ± {f['b'][1]:.2f} (p = {_p(f['b'][2])}), "
            f"c = {f['c'][0]:+.2f} ± {f['c'][1]:.2f} (p = {_p(f['c'][2])})")


def quality_claims(c: Claims, study: Study) -> None:
    q = gap_quality_points(study.runs, study.identity)
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
              f"{_p(full['c'][2])}); r(q, L) = {full['r(q, L)']:+.2f}",
              f"{full['n']} seed-paired gaps ({len(pts)} measured; a config trained twice counted once)",
              "standard error", "least squares, t-test of each coefficient (no correction)", "[trend.md](trend.md)")
        logo = {d: f for d, f in leave_one_group_out(pts).items() if f is not None}
        c.add(f"{corpus}_fit_32x_logo", "; ".join(f"without {d}: {_fit_text(f)}" for d, f in logo.items()),
              ", ".join(f"{f['n']}" for f in logo.values()) + " gaps", "standard error",
              "the same fit leaving out one group at a time; t-test of each coefficient (no correction)",
              "[trend.md](trend.md)")
        for coef in ("b", "c"):
            kept = [d for d, f in logo.items() if f[coef][2] < 0.05]
            lost = [d for d in logo if d not in kept]
            note = (f" (not without {', '.join(lost)})" if full[coef][2] < 0.05 and lost
                    else f" (only without {', '.join(kept)})" if full[coef][2] >= 0.05 and kept else "")
            c.add(f"{corpus}_fit_{coef}_logo_count", f"{len(kept)} of {len(logo)} fits{note}",
                  "leave-one-group-out fits", "", f"{coef}'s p < 0.05 in the fit without that group",
                  "[trend.md](trend.md)")
        q_of = defaultdict(list)
        for p in pts:
            q_of[(p.dataset, p.train_length)].append(p.quality)
        arms = [(f"{corpus}_64seq", 64), (f"{corpus}_16seq", 64), (f"{corpus}_16seq", 256)]
        if all(a in q_of for a in arms):
            c.add(f"{corpus}_matched_quality", "q = " + ", ".join(
                  f"{np.mean(q_of[a]):.1f} ({d.split('_')[1]}, L = {L})" for a in arms for d, L in [a]),
                  "3 kerple_log runs each", "", "mean q: perplexity over positions 0-63 of the same windows "
                  "(a description)", "[trend.md](trend.md)")
        merged = {(p.dataset, p.train_length) for p in count_once(pts) if p.runs > 1}
        c.add(f"{corpus}_fit_replicates", "; ".join(f"{d.replace(' = ', ' and ')} at L = {L}" for d, L in sorted(merged))
              or "none", f"{sum(p.runs > 1 for p in count_once(pts))} seeds", "",
              "runs whose experiment config, base configs and steps are equal but for their paths "
              "(study/replicates.py)", "[trend.md](trend.md)")
    pooled_short, pooled_long = {}, {}
    for corpus in ("latex", "code"):
        short = study.gaps(f"{corpus}_64seq", 64, f"{LOG} (window 64)", LOG, 32 * 64)
        long = study.gaps(f"{corpus}_16seq", 256, f"{LOG} (window 256)", LOG, 32 * 256)
        floor = 2 / math.comb(len(short) + len(long), len(short))
        c.add(f"{corpus}_matched", f"L = 64: {', '.join(f'{v:+.2f}' for v in short.values())}%; L = 256: "
              f"{', '.join(f'{v:+.2f}' for v in long.values())}% (two-sample exact permutation p = "
              f"{_p(permutation_p(list(short.values()), list(long.values())))}; its floor with {len(short)} and "
              f"{len(long)} runs is {floor:.2g})",
              f"{len(short)} and {len(long)} runs", "", "exact two-sample permutation test (no seed pairing "
              "across train lengths)", "[table3.md](table3.md)")
        pooled_short.update({(corpus, s): v for s, v in short.items()})
        pooled_long.update({(corpus, s): v for s, v in long.items()})
    below = [corpus for corpus in ("latex", "code")
             if max(v for (cc, _), v in pooled_short.items() if cc == corpus)
             < min(v for (cc, _), v in pooled_long.items() if cc == corpus)]
    c.add("matched_separated", f"{len(below)} of 2 corpora" + (f" ({', '.join(below)})" if below else ""),
          "corpora, 3 and 3 runs each", "", "count of corpora where every L = 64 gap is below every L = 256 gap",
          "[table3.md](table3.md)")
    t = paired_test(pooled_long, pooled_short)
    c.add("withdrawn_pooled_p", f"p = {_p(t.p)}, t = {-t.t:.1f} over {t.n} pairs", f"{t.n} matched gaps at 32x, both "
          "corpora", "", "paired t-test of L = 64 against L = 256, seed paired with seed across train lengths and "
          "corpora pooled: the test withdrawn (recomputed here only to name it)", "[table3.md](table3.md)")
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
    configs = {trained_as(study.identity, d, L, LOG, seed) for d, L, s in study.ppl if s == LOG
               and (d, L, f"{LOG} (window {L})") in study.ppl for seed in study.ppl[(d, L, f"{LOG} (window {L})")]
               if seed in study.ppl[(d, L, s)]}
    c.add("full_ahead", f"{len(ahead[32])} of {n} runs at 32x and {len(ahead[8])} of {n} at 8x ({len(configs)} distinct "
          "configurations)", "kerple_log runs with a windowed evaluation (every group)", "", "count",
          "[table3.csv](table3.csv)")


def count_claims(c: Claims, study: Study) -> None:
    recs = study.records
    v2 = [r for r in recs if str(r.get("config", "")).startswith("configs/repro_cpu_v2/")]
    c.add("n_records", len(recs), "record.json files in runs/", "", "", "[runs/](runs/)")
    c.add("n_v2", len(v2), "records whose config is under configs/repro_cpu_v2/", "", "", "[runs/](runs/)")
    c.add("n_v3", len(recs) - len(v2), "the other records (configs/repro_cpu_v3/)", "", "", "[runs/](runs/)")
    c.add("n_results", len(study.runs), "evaluations (full attention and windowed)", "", "", "[runs/](runs/)")
    v2_schemes = sorted({r["label"] for r in v2})
    c.add("v2_schemes", _words(len(v2_schemes)).capitalize(), ", ".join(v2_schemes), "", "",
          "[runs/](runs/)")
    by_count = defaultdict(set)  # seeds per (domain) -> schemes, over v2's groups with v3's additions
    for (d, L, s), runs in study.ppl.items():
        if d in DOMAINS and L == V2_L and "(window" not in s:
            by_count[len(runs)].add(NAMES.get(s, s))
    c.add("v2_seeds", "; ".join(f"{n}: {', '.join(sorted(by_count[n]))}" for n in sorted(by_count, reverse=True)),
          "full-attention schemes of code, LaTeX and web at L = 64 (v2 and v3's additions)", "", "", "[table3.md](table3.md)")
    steps = sorted({r.get("steps") for r in recs if r.get("steps")})
    c.add("steps", " / ".join(f"{x:,}" for x in steps), f"{len(recs)} records", "", "", "[runs/](runs/)")
    counts = {k: len(v) for k, v in study.ppl.items() if "(window" not in k[2]}
    few_groups = {(d, L) for (d, L, s), n in counts.items() if n < 3}
    few = sorted(f"{d} L = {L}" for d, L in few_groups)
    few_dirs = sorted({os.path.dirname(str(r.get("config"))) for r in recs
                       if (r["dataset"], r["train_length"]) in few_groups})
    c.add("seeds_range", f"{min(counts.values())}-{max(counts.values())}", "every (group, full-attention scheme)", "", "",
          "[table3.md](table3.md)")
    c.add("seeds_few", (", ".join(few) + f" in {', '.join(few_dirs)}") if few else "none",
          "the groups with a scheme on fewer than 3 seeds", "", "",
          "[table3.md](table3.md)")
    tested = [cell for cell in study.cells.values() if not math.isnan(cell["p"])]
    ns = sorted({cell["n"] for cell in tested})
    two = sorted({f"{cell['dataset']} L = {cell['train_length']} {cell['scheme']}" for cell in tested if cell["n"] == 2})
    c.add("table3_pairs", f"{ns[0]}-{ns[-1]} seed pairs" + (f" ({sum(cell['n'] == 2 for cell in tested)} tests on 2 "
          f"pairs: {'; '.join(two)})" if two else ""), f"{len(tested)} tests of Table 3", "", "", "[table3.csv](table3.csv)")


def same_context_claims(c: Claims, study: Study) -> None:
    """The change from 1x to 32x split into the text and the context (same_context.py), per v2 domain."""
    rows, tests = split_rows(study.runs, 32), context_tests(study.paper)
    text_tests = {d: paired_test({s: study.ppl[(d, V2_L, LOG)][s][V2_L] for s in rows[(d, V2_L, LOG)]},
                                 {s: v["head_ppl"] for s, v in rows[(d, V2_L, LOG)].items()}) for d in DOMAINS}
    text_holm = dict(zip(DOMAINS, holm(text_tests[d].p for d in DOMAINS)))
    src = "[table3.md](table3.md), [runs/](runs/) (position-wise losses)"
    for d in DOMAINS:
        runs = rows[(d, V2_L, LOG)]
        text = [v["text"] for v in runs.values()]
        context = [v["context"] for v in runs.values()]
        t = text_tests[d]
        c.add(f"{d}_log_text_change", f"{_pm(text)}% ({sum(v < 0 for v in text)} of {len(text)} seeds below 1x; p = "
              f"{_p(t.p)}, Holm {_p(text_holm[d])}, exact {_p(t.exact_p)})", f"{len(text)} kerple_log seeds",
              "std over seeds", "perplexity over positions 0-63 of the 32x windows (the same 0-63 tokens of context "
              "as at 1x) against ppl(1x), paired t-test, Holm over the 3 domains; exact sign-flip test", src)
        mean, p, q, _ = tests[(d, V2_L)]
        t = paired_test({s: v["head_ppl"] for s, v in runs.items()}, {s: study.ppl[(d, V2_L, LOG)][s][32 * V2_L]
                                                                      for s in runs})
        c.add(f"{d}_log_context_change", f"{_pm(context)}% ({sum(v > 0 for v in context)} of {len(context)} seeds "
              f"above; p = {_p(p)}, Holm {_p(q)} over the {len(tests)} groups, exact {_p(t.exact_p)})",
              f"{len(context)} kerple_log seeds", "std over seeds", "ppl(32x) against positions 0-63 of the same "
              f"32x windows, paired t-test, Holm over every group's kerple_log ({len(tests)}); exact sign-flip test",
              src)
        total = [v["total"] for v in runs.values()]
        c.add(f"{d}_log_split", f"{np.mean(total):+.1f}% in all = {np.mean(text):+.1f}% from the text and "
              f"{np.mean(context):+.1f}% from the context", f"means over {len(total)} kerple_log seeds", "",
              "(1 + text)(1 + context) = ppl(32x) / ppl(1x) per seed; the means of each (a description)", src)
        win = rows.get((d, V2_L, f"{LOG} (window {V2_L})"), {})
        if win:
            total = [v["total"] for v in win.values()]
            c.add(f"{d}_window_32x_vs_1x", f"{_pm(total)}% ({sum(v < 0 for v in total)} of {len(total)} seeds lower)",
                  f"{len(total)} seeds", "std over seeds", "a description (its difference from full attention is "
                  "the windowed row of Table 3 at 32x)", "[table3.md](table3.md)")


def v3_alibi_claims(c: Claims, study: Study) -> None:
    """ALiBi against kerple_log in v3's equal-token trend, where the v2 direction is quoted."""
    src = "[table3.md](table3.md), [table3.csv](table3.csv)"
    cells = 0
    ahead_cells = []
    for d in ("code_warmup10", "latex_warmup10"):
        Ls = sorted(L for dd, L, s in study.ppl if dd == d and s == ALIBI)
        if not Ls or not all((d, L, LOG) in study.ppl for L in Ls):
            continue
        parts, holm_parts, order = [], [], []
        for L in Ls:
            g = [v for x in study.row(d, L, ALIBI) for v in study.gaps(d, L, ALIBI, LOG, x["length"]).values()]
            parts.append(f"L = {L}: {sum(v < 0 for v in g)} of {len(g)}")
            row = study.row(d, L, ALIBI)
            sig = [f"{'ALiBi' if x['better'] else 'KERPLE-log'} better at {x['length'] // L}x (p_holm {_p(x['p_holm'])})"
                   for x in row if x["better"] or x["dagger"]]
            holm_parts.append(f"L = {L}: {', '.join(sig) or 'no length'}")
            three = sorted((s for s in (LOG, POWER, ALIBI) if (d, L, s) in study.ppl),
                           key=lambda s: study.means(d, L, s, 32 * L))
            order.append(f"L = {L}: " + " < ".join(f"{NAMES[s]} {study.means(d, L, s, 32 * L):.1f}" for s in three))
            means = [np.mean(list(study.gaps(d, L, ALIBI, LOG, x["length"]).values())) for x in row]
            cells += len(means)
            ahead_cells.append((d, sum(m > 0 for m in means), len(means)))
        c.add(f"{d}_alibi_ahead_pairs", "; ".join(parts), "seed x length pairs (3 seeds x 6 lengths per L)", "",
              "count of pairs whose ALiBi perplexity is below kerple_log's (a description)", src)
        c.add(f"{d}_alibi_holm", "; ".join(holm_parts), "3 seed pairs per length", "",
              "Table 3's paired t-test, Holm within the row (6 lengths)", src)
        c.add(f"{d}_order_32x", "; ".join(order), "3 seeds each", "", "none (an order of means at 32x)", src)
    per = defaultdict(lambda: [0, 0])
    for d, a, n in ahead_cells:
        per[d][0] += a
        per[d][1] += n
    c.add("alibi_behind_v3", ", ".join(f"{a} of {n} in {d}" for d, (a, n) in per.items()),
          f"(group, length) cells of v3's equal-token trend ({cells}), 3 seed pairs each", "",
          "count of cells where ALiBi's mean gap to kerple_log is above 0 (a description)", src)


def paper_table_claims(c: Claims, study: Study) -> None:
    """The table against the paper's own claims (paper_claims.py): one claim per (claim, domain) cell, and v2's
    three verdicts per claim for the prose."""
    found = verdicts(study.runs, study.paper)
    for key, claim, test, _ in PAPER_CLAIMS:
        for d in DOMAINS:
            c.add(f"paper_{key}_{d}", cell_text(found[(key, d)]), f"{claim}: {d} (v2: {d} L = 64; v3: its other "
                  "groups)", "", f"{test}; agree / disagree only at p_holm < 0.05 (study/paper_claims.py)",
                  "[table3.csv](table3.csv), [growth.md](growth.md)")
        c.add(f"paper_{key}_test", test, "", "", "the test of the row (a description)", "study/paper_claims.py")
        c.add(f"paper_{key}_v2", ", ".join(f"{d.replace('latex', 'LaTeX')} {found[(key, d)]['v2'].word}"
                                           for d in DOMAINS), f"{claim}: v2's three domains at L = 64", "", test,
              "[table3.csv](table3.csv)")


def replicate_claims(c: Claims, study: Study) -> None:
    """Run-to-run noise: the same config and seed trained under two names (replicates.py)."""
    pairs = replicate_differences(study.runs, study.identity)
    if not pairs:
        return
    largest = [max(abs(v) for v in p["diff"].values()) for p in pairs]
    worst = pairs[int(np.argmax(largest))]
    at = max(worst["diff"], key=lambda L: abs(worst["diff"][L]))
    scheme, d, seed, L = worst["a"]
    c.add("replicate_noise", f"up to {worst['diff'][at]:+.1f}% ({NAMES.get(scheme, scheme)} seed "
          f"{seed}, {d} against {worst['b'][1]} at L = {L}, {at // L}x); {sum(x > 0 for x in largest)} of "
          f"{len(pairs)} pairs differ, by a median of {float(np.median(largest)):.1f}% at their most",
          f"{len(pairs)} pairs of results that trained the same config and seed under two group names, every "
          "length both scored on the same text", "",
          "|100 (ppl_a / ppl_b - 1)|, the largest over lengths per pair (a description of run-to-run noise)",
          "[trend.md](trend.md)")


def study_claims(runs, records, config_root: str | None = None) -> Claims:
    """Every claim; config_root: the checkout the records' configs are relative to (replicates.py)."""
    c = Claims()
    study = Study(runs, records, config_root)
    count_claims(c, study)
    v2_claims(c, study)
    power_growth_family(c, study)
    extrapolation_claims(c, study)
    log_scale_claims(c, study)
    web_claims(c, study)
    drift_claims(c, study)
    flat_claims(c, study)
    trend_claims(c, study)
    quality_claims(c, study)
    same_context_claims(c, study)
    v3_alibi_claims(c, study)
    replicate_claims(c, study)
    paper_table_claims(c, study)
    c.add("exact_floor_3", f"{min_sign_flip_p(3):.2g}", "3 pairs", "", "2 / 2^3", "")
    c.add("exact_floor_5", f"{min_sign_flip_p(5):.4g}", "5 pairs", "", "2 / 2^5", "")
    return c


def claims_markdown(claims: Claims) -> str:
    lines = ["# The report's figures, each from the records", "",
             "Every `{{name}}` of README.template.md, as README.md quotes it (study/claims.py). "
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
        raise ValueError(f"{where}: no claim named {', '.join(unknown)}; add it to study/claims.py "
                         "or fix the placeholder")
    return PLACEHOLDER.sub(lambda m: claims[m.group(1)].value, template)


TEMPLATES = {"README.md": "README.template.md", "summary": "summary.template.md"}  # output -> template file
BLOCK = ("<!-- study:summary:begin -->", "<!-- study:summary:end -->")  # docs/status.md's generated paragraph


def report_texts(runs, records, template_dir: str, config_root: str | None = None) -> dict[str, str]:
    """{"README.md": the report, "claims.md": the claims table, "summary": docs/status.md's paragraph},
    each rendered from the templates in template_dir; config_root: the checkout the records' configs are
    relative to (without it no two runs are taken for the same configuration)."""
    claims = study_claims(runs, records, config_root)
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
