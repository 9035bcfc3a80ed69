"""The paper's own claims, each set against the records per domain: agree / disagree / not shown / not run.

A claim is one or more comparisons ("A has lower perplexity than B"), each tested at one length or more
in one group (a dataset at one train length). A tested length is evidence: which way the means go, and
its Holm-adjusted p. The verdict of a claim in a group is decided by the tests alone, so no verdict can
read stronger than its test:

- **disagree**: some comparison goes against the claim with p_holm < ALPHA (at any length);
- **agree**: no comparison goes against it, and every comparison goes its way with p_holm < ALPHA at
  one length or more;
- **not shown**: neither (including a comparison without a test: one seed);
- **not run**: the group lacks a scheme the claim needs (the records are not guessed at).

The families of the Holm correction: for a comparison read over lengths, the row of Table 3 (the
scheme against kerple_log at every length of the group) or of growth.md (8x and 32x); for a claim
about the order at 32x, its own comparisons in the group; for the perplexity's change with length,
every group's test at once (same_context.py's control: within the same 32x windows).

Per domain the group at train length 64 of v2 (with v3's added seeds and T5) is given first, then
every other group of that domain (v3's designs), each by name: a claim holds "in v2" or "in v2 and
v3", never unqualified when a v3 group disagrees.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from megatron.evaluation.stats import holm, paired_test
from study.aggregate import table3_cells
from study.growth import growth_rows
from study.same_context import split_rows
from study.schemes import ALIBI, DOMAINS, LOG, NAMES, PAPER_SIX, ROTARY, SIN, T5, V2_L, window

ALPHA = 0.05
AGREE, DISAGREE, NOT_SHOWN, NOT_RUN = "agree", "disagree", "not shown", "not run"
TOP = 32  # the longest factor evaluated: the paper's order and the perplexity's change are read there


@dataclass(frozen=True)
class Evidence:
    at: str  # where it was tested, e.g. "8x"
    claimed: bool  # the means go the way the claim says
    p_holm: float  # nan: no test


@dataclass(frozen=True)
class Comparison:
    name: str  # e.g. "vs ALiBi"
    evidence: tuple  # of Evidence

    def supported(self) -> list[Evidence]:
        return [e for e in self.evidence if e.claimed and e.p_holm < ALPHA]

    def contrary(self) -> list[Evidence]:
        return [e for e in self.evidence if not e.claimed and e.p_holm < ALPHA]


@dataclass(frozen=True)
class Verdict:
    word: str  # AGREE, DISAGREE, NOT_SHOWN or NOT_RUN
    detail: str  # the tests it rests on, with their p


def _p(p: float) -> str:
    return "–" if p is None or math.isnan(p) else f"{p:.2g}"


def _where(evidence: list[Evidence]) -> str:
    return ", ".join(e.at for e in evidence) + f" (p_holm {'<= ' if len(evidence) > 1 else ''}" \
        f"{_p(max(e.p_holm for e in evidence))})"


def decide(comparisons: list[Comparison]) -> Verdict:
    """The verdict of one claim in one group (the module docstring's rule), with the tests it rests on."""
    if not comparisons:
        return Verdict(NOT_RUN, "")
    against = [(c, c.contrary()) for c in comparisons if c.contrary()]
    if against:
        return Verdict(DISAGREE, "; ".join(f"{c.name}: against at {_where(ev)}" for c, ev in against))
    if all(c.supported() for c in comparisons):
        return Verdict(AGREE, "; ".join(f"{c.name}: at {_where(c.supported())}" for c in comparisons))
    held = [f"{c.name}: at {_where(c.supported())}" for c in comparisons if c.supported()]
    open_ = [c for c in comparisons if not c.supported()]
    tested = [(e.p_holm, c.name) for c in open_ for e in c.evidence if not math.isnan(e.p_holm)]
    closest = (f"smallest p_holm {_p(min(tested)[0])}" + (f": {min(tested)[1]}" if len(comparisons) > 1 else "")
               if tested else "no test (one seed)")
    if len(comparisons) == 1:
        parts = [closest]
    elif not held:
        parts = [f"none of the {len(comparisons)} comparisons decided, {closest}"]
    else:
        parts = held + [f"open: {', '.join(c.name for c in open_)}, {closest}"]
    return Verdict(NOT_SHOWN, "; ".join(parts))


class Records:
    """The lookups every claim reads: perplexities by (dataset, L, scheme) -> {seed: {length: ppl}}, Table 3's
    cells, growth.md's rows and the same-context split at 32x."""

    def __init__(self, runs):
        ppl = defaultdict(dict)
        for r in runs:
            if r.train_length:
                ppl[(r.dataset, r.train_length, r.scheme)][r.seed] = r.ppl
        self.ppl = dict(ppl)  # a lookup of a scheme a group lacks fails instead of adding it
        self.cells = {(c["dataset"], c["train_length"], c["scheme"], c["length"]): c for c in table3_cells(runs)}
        self.growth = {k: {row["scheme"]: row for row in rows} for k, rows in growth_rows(runs).items()}
        self.split = split_rows(runs, TOP)

    def groups(self, domain: str) -> list[tuple[str, int]]:
        """The domain's groups, v2's (domain, 64) first, then the others by name and train length."""
        found = sorted({(d, L) for d, L, _ in self.ppl if d == domain or d.startswith(domain + "_")},
                       key=lambda g: (g != (domain, V2_L), g[0], g[1]))
        return found

    def has(self, d: str, L: int, *schemes: str) -> bool:
        return all((d, L, s) in self.ppl for s in schemes)

    def mean_gap(self, d: str, L: int, a: str, b: str, length: int) -> float:
        """Mean of 100 (ppl_a / ppl_b - 1) over the seeds both have at this length (nan: none)."""
        A, B = self.ppl[(d, L, a)], self.ppl[(d, L, b)]
        v = [100.0 * (A[s][length] / B[s][length] - 1.0) for s in sorted(set(A) & set(B), key=str)  # a fixed order:
             if length in A[s] and length in B[s]]  # the same float sum on every machine
        return float(np.mean(v)) if v else math.nan


def row_comparison(rec: Records, d: str, L: int, scheme: str, reference_lower: bool, name: str) -> Comparison:
    """Table 3's row of `scheme` against kerple_log beyond the train length (Holm within the row);
    reference_lower: the claim is that kerple_log's perplexity is the lower one."""
    ev = []
    for (dd, LL, s, length), c in sorted(rec.cells.items(), key=lambda kv: kv[0][3]):
        if (dd, LL, s) != (d, L, scheme) or length <= L:
            continue
        # the direction of the test where it decided (Table 3's marks), else of the mean gap
        log_lower = c["dagger"] or (not c["better"] and rec.mean_gap(d, L, scheme, LOG, length) > 0)
        ev.append(Evidence(f"{length // L}x", log_lower == reference_lower, c["p_holm"]))
    return Comparison(name, tuple(ev))


def order_comparisons(rec: Records, d: str, L: int, pairs: list[tuple[str, str]]) -> list[Comparison]:
    """(lower, higher) pairs claimed at 32x, each a paired t-test on the seeds both share, Holm over the pairs."""
    length = TOP * L
    tests, claimed = [], []
    for lo, hi in pairs:
        a, b = rec.ppl[(d, L, lo)], rec.ppl[(d, L, hi)]
        seeds = [s for s in set(a) & set(b) if length in a[s] and length in b[s]]
        t = paired_test({s: a[s][length] for s in seeds}, {s: b[s][length] for s in seeds})
        tests.append(t.p)
        claimed.append(t.t < 0 if not math.isnan(t.t) else rec.mean_gap(d, L, hi, lo, length) > 0)  # t: lo - hi
    adjusted = holm(tests)
    return [Comparison(f"{NAMES[lo]} < {NAMES[hi]}", (Evidence(f"{TOP}x", c, q),))
            for (lo, hi), c, q in zip(pairs, claimed, adjusted)]


def present(rec: Records, d: str, L: int) -> list[str]:
    return [s for s in PAPER_SIX if rec.has(d, L, s)]


def log_best(rec, d, L):
    others = [s for s in present(rec, d, L) if s != LOG]
    return order_comparisons(rec, d, L, [(LOG, s) for s in others]) if LOG in present(rec, d, L) and others else []


def alibi_second(rec, d, L):
    schemes = present(rec, d, L)
    if not {LOG, ALIBI} <= set(schemes) or len(schemes) < 3:
        return []
    return order_comparisons(rec, d, L, [(LOG, ALIBI)] + [(ALIBI, s) for s in schemes if s not in (LOG, ALIBI)])


def log_below(scheme):
    def claim(rec, d, L):
        return [row_comparison(rec, d, L, scheme, True, f"vs {NAMES[scheme]}")] if rec.has(d, L, LOG, scheme) else []
    return claim


def lead_from_extrapolation(rec, d, L):
    """growth.md's ALiBi row: the claim is that kerple_log's perplexity grows less with length than ALiBi's."""
    row = rec.growth.get((d, L), {}).get(ALIBI)
    if row is None:
        return []
    ev = tuple(Evidence(f"{k}x", row["test"][k].reference_better or (not row["test"][k].other_better and float(
        np.mean(list(row["growth"][k].values()))) > 0), row["test"][k].p_adjusted) for k in sorted(row["test"]))
    return [Comparison("growth gap of ALiBi", ev)]


def context_tests(rec: Records) -> dict[tuple, tuple[float, float, float, float]]:
    """{(dataset, L): (mean context change %, its p, p_holm, t)} of kerple_log: ppl(32L) against the same 32L
    windows' positions 0..L-1, a paired t-test over seeds (t > 0: the whole windows' perplexity is the lower),
    Holm over every group at once."""
    keys = sorted(((d, L) for d, L, s in rec.split if s == LOG and len(rec.split[(d, L, s)]) >= 2), key=str)
    raw = {}
    for d, L in keys:
        runs = rec.split[(d, L, LOG)]
        t = paired_test({s: v["head_ppl"] for s, v in runs.items()}, {s: rec.ppl[(d, L, LOG)][s][TOP * L] for s in runs})
        raw[(d, L)] = (float(np.mean([v["context"] for v in runs.values()])), t.p, t.t)
    adjusted = dict(zip(raw, holm(p for _, p, _ in raw.values())))
    return {k: (m, p, adjusted[k], t) for k, (m, p, t) in raw.items()}


def no_rise(rec, d, L, tests=None):
    tests = tests if tests is not None else context_tests(rec)
    if (d, L) not in tests:
        return []
    mean, _, q, t = tests[(d, L)]
    falls = t > 0 if not math.isnan(t) else mean < 0
    return [Comparison(f"{mean:+.1f}% within the {TOP}x windows", (Evidence(f"{TOP}x", falls, q),))]


def full_beats_window(rec, d, L):
    w = window(L)
    return [row_comparison(rec, d, L, w, True, "vs windowed@L")] if rec.has(d, L, LOG, w) else []


# (key, the paper's claim, the test) -> how it is read in one group
CLAIMS = (
    ("log_best", "KERPLE-log has the lowest perplexity at long lengths (Table 3)",
     "paired t-test at 32x against each other scheme of the paper's six that was run, Holm over those", log_best),
    ("alibi_second", "ALiBi is second, after KERPLE-log (Table 3)",
     "paired t-test at 32x: KERPLE-log < ALiBi < each other scheme run, Holm over those", alibi_second),
    ("log_below_alibi", "KERPLE-log has lower perplexity than ALiBi beyond the train length (Table 3)",
     "Table 3's row: paired t-test per length > L, Holm within the row", log_below(ALIBI)),
    ("lead_extrapolation", "KERPLE-log's lead over ALiBi comes from extrapolation",
     "growth.md: paired t-test of the growth ratios ppl(kL) / ppl(L), k = 8, 32, Holm over the two",
     lead_from_extrapolation),
    ("no_rise", "Perplexity does not rise out to 32x (KERPLE-log, Table 3)",
     "same windows: ppl(32L) against positions 0..L-1 of the 32L windows, paired t-test, Holm over every group; "
     "agree only where it falls", no_rise),
    ("log_beats_rotary", "KERPLE-log beats rotary (Table 3)", "Table 3's row, lengths > L, Holm within the row",
     log_below(ROTARY)),
    ("log_beats_sin", "KERPLE-log beats sinusoidal (Table 3)", "Table 3's row, lengths > L, Holm within the row",
     log_below(SIN)),
    ("log_beats_t5", "KERPLE-log beats T5 (Table 3; here T5 with max distance L)",
     "Table 3's row, lengths > L, Holm within the row", log_below(T5)),
    ("full_beats_window", "Full attention beats its windowed@L evaluation (Fig. 5)",
     "Table 3's row of windowed@L, lengths > L, Holm within the row", full_beats_window),
)


def group_name(d: str, L: int) -> str:
    return f"{d} L = {L}"


def verdicts(runs, rec: Records | None = None) -> dict[tuple[str, str], dict]:
    """{(claim key, domain): {"v2": Verdict, "v3": [(group name, Verdict)]}}: v3 lists every other group of
    the domain whose records hold the claim's schemes; rec: Records(runs) when already built."""
    rec = rec or Records(runs)
    tests = context_tests(rec)
    out = {}
    for key, _, _, read in CLAIMS:
        for domain in DOMAINS:
            v2, v3 = Verdict(NOT_RUN, ""), []
            for d, L in rec.groups(domain):
                comparisons = read(rec, d, L, tests) if read is no_rise else read(rec, d, L)
                v = decide(comparisons)
                if (d, L) == (domain, V2_L):
                    v2 = v
                elif v.word != NOT_RUN:
                    v3.append((group_name(d, L), v))
            out[(key, domain)] = {"v2": v2, "v3": v3}
    return out


def cell_text(cell: dict) -> str:
    """One table cell: v2's verdict and its tests, then v3's groups by verdict (agree and disagree each with
    their tests, not shown by name)."""
    v2 = cell["v2"]
    text = f"v2: **{v2.word}**" + (f" ({v2.detail})" if v2.detail else "")
    if not cell["v3"]:
        return text + "; v3: not run"
    parts = []
    for word in (DISAGREE, AGREE):
        parts += [f"**{word}** in {g} ({v.detail})" for g, v in cell["v3"] if v.word == word]
    quiet = [g for g, v in cell["v3"] if v.word == NOT_SHOWN]
    if quiet:
        parts.append(f"not shown in {', '.join(quiet)}")
    return text + "; v3: " + "; ".join(parts)
