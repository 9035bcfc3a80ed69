"""Mean ± std over seeds and the paired t-test behind the paper's Table 3 daggers.

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
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

DAGGER = "†"
DOUBLE_DAGGER = "‡"
FOOTNOTE = ("{dagger} = the reference scheme `{ref}` has significantly lower perplexity than this scheme at this "
            "dataset and length (paired two-sided t-test over seeds, alpha = {alpha}; pairs matched by seed). "
            "{double_dagger} = this scheme has significantly lower perplexity than `{ref}` (the same test). "
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

    @property
    def mark(self) -> str:
        return DAGGER if self.reference_better else DOUBLE_DAGGER if self.other_better else ""


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
    return PairedTest(len(seeds), t, p, significant and diff.mean() < 0, other_better=significant and diff.mean() > 0)

