"""Mean ± std over seeds, the paired t-test behind the paper's Table 3 daggers, the Holm-Bonferroni
correction of a family of such tests, and the exact tests for a handful of seeds.

Convention (the paper's Table 3): a dagger † goes on the cell of a scheme X at (dataset, length)
when the REFERENCE scheme (default `kerple_log`) is significantly BETTER there, i.e. has lower
perplexity, under a paired two-sided t-test (scipy.stats.ttest_rel) over seeds at alpha = 0.05.
The reference's own cells never carry a mark. Runs are paired by seed: seed s of X is compared
with seed s of the reference, because runs sharing a seed share data order and initial draw, so
pairing removes that variance. Two-sided means "different"; we mark only when the difference
goes the reference's way (mean of reference - X < 0), so † reads "reference wins significantly".
The paper marks only that direction; we also mark the other (‡: X wins significantly), because on
a small-scale reproduction "the reference loses significantly" is a finding a reader must see.
No test is possible with fewer than 2 shared seeds (reported as such, no mark), and identical
paired values give t = nan in scipy (zero variance of the differences): no mark either.

Many tests at once (a table of schemes x lengths): `holm` adjusts the p-values of one family
(Holm-Bonferroni, step-down: controls the chance of any false mark in the family at alpha, for any
dependence between the tests), and `PairedTest.corrected` re-marks a test by its adjusted p.
With 3-5 seeds the t-test's normality cannot be checked; `sign_flip_p` is the exact paired test
that needs none (every assignment of signs to the differences is equally likely under "no
difference"), and `permutation_p` the exact two-sample test for runs that are not paired. Both have
a floor: n = 3 pairs cannot go below p = 0.25, n = 5 below 0.0625 (`min_sign_flip_p`).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats as sps

DAGGER = "†"
DOUBLE_DAGGER = "‡"
FOOTNOTE = ("{dagger} = the reference scheme `{ref}` has significantly lower perplexity than this scheme at this "
            "dataset and length (paired two-sided t-test over seeds, pairs matched by seed, Holm-Bonferroni "
            "adjusted within the row: the family is this scheme against `{ref}` at every length of this table, "
            "{m} tests; adjusted p < alpha = {alpha}; the rows are not corrected against each other). "
            "{double_dagger} = this scheme has significantly lower perplexity than `{ref}` "
            "(the same test). table3.csv has each test's raw p, its adjusted p and the exact sign-flip p "
            "(no normality assumed; with n pairs it cannot go below 2 / 2^n: 0.25 for 3, 0.0625 for 5). "
            "Cells are mean ± sample std (ddof=1) over seeds; no test when fewer than 2 seeds are shared.")


def mean_std(values) -> tuple[float, float]:
    """(mean, sample std with ddof=1); std is nan for a single value (undefined, not 0)."""
    a = np.asarray(list(values), dtype=float)
    if a.size == 0:
        raise ValueError("mean_std needs at least one value")
    return float(a.mean()), float(a.std(ddof=1)) if a.size > 1 else math.nan


def format_mean_std(mean: float, std: float, digits: int = 2) -> str:
    if math.isnan(std):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


@dataclass(frozen=True)
class PairedTest:
    """Outcome of comparing the reference with one scheme at one (dataset, length)."""

    n: int  # number of seeds present for both schemes
    t: float  # t statistic of (reference - other); nan when not computable
    p: float  # two-sided p-value; nan when not computable
    reference_better: bool  # True -> put a dagger on the other scheme's cell
    note: str = ""  # why no test was run, if none was
    other_better: bool = False  # True -> the other scheme wins significantly: a double dagger
    p_adjusted: float = math.nan  # the p of the family's correction (nan: not corrected); marks follow it
    exact_p: float = math.nan  # sign_flip_p of the paired differences (nan: no test)

    @property
    def mark(self) -> str:
        return DAGGER if self.reference_better else DOUBLE_DAGGER if self.other_better else ""

    def corrected(self, p_adjusted: float, alpha: float = 0.05) -> PairedTest:
        """This test marked by its family-corrected p instead of its own (the direction stays the t's)."""
        significant = not math.isnan(p_adjusted) and p_adjusted < alpha
        return replace(self, p_adjusted=p_adjusted, reference_better=significant and self.t < 0,
                       other_better=significant and self.t > 0)


def paired_test(reference: dict, other: dict, alpha: float = 0.05) -> PairedTest:
    """reference/other: {seed: perplexity}. Pairs by seed; see the module docstring for the rule."""
    seeds = sorted(set(reference) & set(other))
    if len(seeds) < 2:
        return PairedTest(len(seeds), math.nan, math.nan, False,
                          f"no test: {len(seeds)} paired seed(s), at least 2 are needed")
    ref = np.array([reference[s] for s in seeds], dtype=float)
    oth = np.array([other[s] for s in seeds], dtype=float)
    diff = ref - oth
    if np.all(diff == 0):
        return PairedTest(len(seeds), math.nan, math.nan, False, "no test: identical values (t is undefined)")
    if np.all(diff == diff[0]):
        # A constant nonzero shift has zero variance: scipy returns t = +-inf, p = 0, a degenerate test.
        return PairedTest(len(seeds), math.nan, math.nan, False, "no test: the paired differences have zero variance")
    res = sps.ttest_rel(ref, oth)
    t, p = float(res.statistic), float(res.pvalue)
    significant = not math.isnan(p) and p < alpha
    return PairedTest(len(seeds), t, p, significant and diff.mean() < 0, other_better=significant and diff.mean() > 0,
                      exact_p=sign_flip_p(diff))


def holm(pvalues) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the input order. The family is the finite p-values given
    (nan: no test, left nan and not counted): the i-th smallest of m is multiplied by m - i (i from 0),
    each kept at least as large as the one before, capped at 1. A test is significant in the family
    at alpha exactly when its adjusted p < alpha."""
    ps = [float(p) for p in pvalues]
    order = sorted((i for i, p in enumerate(ps) if not math.isnan(p)), key=lambda i: ps[i])
    out, running = [math.nan] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * ps[i]))
        out[i] = running
    return out


def correct_family(tests: list[PairedTest], alpha: float = 0.05) -> list[PairedTest]:
    """Every test of one family re-marked by its Holm-adjusted p."""
    return [t.corrected(q, alpha) for t, q in zip(tests, holm(t.p for t in tests))]


def sign_flip_p(differences) -> float:
    """Exact two-sided p of the paired permutation test: the share of the 2^n ways of flipping the
    differences' signs whose |sum| is at least the observed |sum|. nan without a difference; n <= 20."""
    d = np.asarray(list(differences), dtype=float)
    if d.size == 0 or d.size > 20 or not np.any(d):
        return math.nan
    observed = abs(d.sum())
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=d.size)))
    sums = np.abs(signs @ d)
    return float(np.mean(sums >= observed - 1e-12 * max(1.0, observed)))


def min_sign_flip_p(n: int) -> float:
    """The smallest p sign_flip_p can give with n pairs (all the same sign): 2 / 2^n."""
    return 2.0 / 2 ** n


def permutation_p(a, b) -> float:
    """Exact two-sided p of the two-sample permutation test of mean(a) - mean(b): the share of the ways of
    splitting the pooled values into groups of len(a) and len(b) whose |difference of means| is at
    least the observed one. For runs that share no pairing (e.g. two train lengths: a seed does not
    draw the same data at both)."""
    a, b = [float(x) for x in a], [float(x) for x in b]
    pooled, k = a + b, len(a)
    if not a or not b:
        return math.nan
    observed = abs(np.mean(a) - np.mean(b))
    count = total = 0
    for idx in itertools.combinations(range(len(pooled)), k):
        rest = [pooled[i] for i in range(len(pooled)) if i not in idx]
        total += 1
        count += abs(np.mean([pooled[i] for i in idx]) - np.mean(rest)) >= observed - 1e-12 * max(1.0, observed)
    return count / total

