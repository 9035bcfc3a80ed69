"""The Table 3 dagger rule against hand-computed paired t-tests."""
import math

import pytest

from megatron.evaluation.stats import (
    DAGGER,
    DOUBLE_DAGGER,
    correct_family,
    format_mean_std,
    holm,
    mean_std,
    min_sign_flip_p,
    paired_test,
    permutation_p,
    sign_flip_p,
)


def t_by_hand(a, b):
    """Paired t written out: d = a - b, t = mean(d) / (sd(d) / sqrt(n)), sd with n - 1."""
    d = [x - y for x, y in zip(a, b)]
    n = len(d)
    m = sum(d) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in d) / (n - 1))
    return m / (sd / math.sqrt(n))


def test_significant_three_seed_case_matches_hand_computation():
    ref = {1: 10.0, 2: 11.0, 3: 12.0}
    other = {1: 11.0, 2: 12.5, 3: 13.0}
    # d = [-1, -1.5, -1]: mean -7/6, sd = sqrt(1/12), t = -7 exactly.
    assert t_by_hand(ref.values(), other.values()) == pytest.approx(-7.0)
    # With 2 degrees of freedom the t distribution has P(|T| > t) = 1 - t / sqrt(2 + t^2),
    # so p = 1 - 7 / sqrt(51) = 0.01980394... (computed independently of scipy).
    res = paired_test(ref, other)
    assert res.n == 3 and res.t == pytest.approx(-7.0)
    assert res.p == pytest.approx(0.0198039411803932, rel=1e-9)
    assert res.reference_better and res.mark == DAGGER


def test_non_significant_case():
    ref = {1: 10.0, 2: 11.0, 3: 12.0}
    other = {1: 10.5, 2: 10.8, 3: 12.9}
    t = t_by_hand(ref.values(), other.values())  # d = [-0.5, 0.2, -0.9]
    assert t == pytest.approx(-1.2443420, rel=1e-6)  # d = [-0.5, 0.2, -0.9]: t = -0.4 / sqrt(0.31 / 3)
    res = paired_test(ref, other)
    assert res.p == pytest.approx(1 - abs(t) / math.sqrt(2 + t * t), rel=1e-9)  # 0.3394...
    assert res.p == pytest.approx(0.33942, abs=1e-5)
    assert not res.reference_better and res.mark == ""


def test_reference_significantly_worse_gets_a_double_dagger_not_a_dagger():
    res = paired_test({1: 11.0, 2: 12.5, 3: 13.0}, {1: 10.0, 2: 11.0, 3: 12.0})
    assert res.p < 0.05 and res.t == pytest.approx(7.0) and not res.reference_better
    assert res.other_better and res.mark == DOUBLE_DAGGER


def test_a_non_significant_difference_gets_neither_mark():
    res = paired_test({1: 20.0, 2: 21.0, 3: 22.0}, {1: 20.5, 2: 20.8, 3: 22.9})
    assert not res.reference_better and not res.other_better and res.mark == ""


def test_pairing_is_by_seed_not_by_position():
    ref = {1: 10.0, 2: 11.0, 3: 12.0}
    other = {3: 13.0, 1: 11.0, 2: 12.5, 4: 99.0}  # seed 4 has no partner and is ignored
    res = paired_test(ref, other)
    assert res.n == 3 and res.t == pytest.approx(-7.0)


def test_fewer_than_two_paired_seeds_means_no_test():
    res = paired_test({1: 10.0, 2: 11.0}, {2: 50.0, 3: 60.0})
    assert res.n == 1 and math.isnan(res.p) and not res.reference_better
    assert "1 paired seed(s)" in res.note


def test_identical_values_give_no_mark():
    res = paired_test({1: 10.0, 2: 11.0, 3: 12.0}, {1: 10.0, 2: 11.0, 3: 12.0})
    assert math.isnan(res.p) and res.mark == "" and "identical" in res.note


def test_mean_std_uses_sample_std():
    m, s = mean_std([1.0, 2.0, 3.0, 4.0])
    assert m == 2.5 and s == pytest.approx(math.sqrt(5 / 3))
    assert format_mean_std(m, s) == "2.50 ± 1.29"
    m1, s1 = mean_std([7.0])
    assert m1 == 7.0 and math.isnan(s1) and format_mean_std(m1, s1) == "7.00"


def test_holm_by_hand():
    # m = 4 sorted 0.01, 0.02, 0.03, 0.04: x4 = 0.04, x3 = 0.06, x2 = 0.06 (kept monotone), x1 = 0.06
    assert holm([0.03, 0.01, 0.04, 0.02]) == pytest.approx([0.06, 0.04, 0.06, 0.06])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # 2 x 0.5 = 1, and 0.9 may not go below it
    out = holm([0.01, math.nan, 0.2])  # no test: not in the family (m = 2)
    assert out[0] == pytest.approx(0.02) and math.isnan(out[1]) and out[2] == pytest.approx(0.2)


def test_holm_between_raw_and_bonferroni():
    ps = [0.0011, 0.049, 0.012, 0.3, 0.0085]
    adj = holm(ps)
    assert all(p <= a <= min(1.0, len(ps) * p) for p, a in zip(ps, adj))
    assert adj == pytest.approx([0.0055, 0.098, 0.036, 0.3, 0.034])


def test_a_correction_removes_a_mark_the_raw_test_gave():
    # LaTeX's log-vs-ALiBi pattern: every raw p of the row below 0.05, six lengths in the family
    ref = {1: 10.0, 2: 11.0, 3: 12.0}
    other = {1: 11.0, 2: 12.5, 3: 13.0}  # raw p = 0.0198 (the hand case above)
    tests = [paired_test(ref, other)] * 6
    assert all(t.mark == DAGGER for t in tests)
    fixed = correct_family(tests)
    assert all(t.p_adjusted == pytest.approx(6 * 0.0198039411803932) and t.mark == "" for t in fixed)
    assert correct_family(tests[:2])[0].mark == DAGGER  # a family of 2: 0.0396 < 0.05


def test_sign_flip_is_exact_and_has_a_floor():
    assert sign_flip_p([-1.0, -1.5, -1.0]) == pytest.approx(0.25) == min_sign_flip_p(3)
    assert sign_flip_p([-1, -2, -3, -4, -5]) == pytest.approx(2 / 32) == min_sign_flip_p(5)
    # d = (1, -2, 3): sums of the 8 sign patterns |±1 ±2 ±3| = 6,0,2,4,4,2,0,6; observed 2: 6 of 8 at least 2
    assert sign_flip_p([1.0, -2.0, 3.0]) == pytest.approx(6 / 8)
    assert math.isnan(sign_flip_p([])) and math.isnan(sign_flip_p([0.0, 0.0]))
    scipy_stats = pytest.importorskip("scipy.stats")
    d = [0.4, -0.1, 0.9, 1.3, 0.2]
    ref = scipy_stats.permutation_test((d,), lambda x: abs(sum(x)), permutation_type="samples",
                                       alternative="greater", n_resamples=10_000)
    assert sign_flip_p(d) == pytest.approx(ref.pvalue)


def test_two_sample_permutation_by_hand_and_against_scipy():
    # 3 vs 3, fully separated: 2 of the C(6, 3) = 20 splits are as extreme (both directions)
    assert permutation_p([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]) == pytest.approx(0.1)
    scipy_stats = pytest.importorskip("scipy.stats")
    a, b = [0.55, 0.87, 0.35, 1.2], [0.1, 0.3, 0.62]
    ref = scipy_stats.permutation_test((a, b), lambda x, y: abs(sum(x) / len(x) - sum(y) / len(y)),
                                       permutation_type="independent", alternative="greater", n_resamples=10_000)
    assert permutation_p(a, b) == pytest.approx(ref.pvalue)


def test_paired_test_carries_the_exact_p():
    res = paired_test({1: 10.0, 2: 11.0, 3: 12.0}, {1: 11.0, 2: 12.5, 3: 13.0})
    assert res.exact_p == pytest.approx(0.25) and math.isnan(res.p_adjusted)
