"""The Table 3 dagger rule against hand-computed paired t-tests."""
import math

import pytest

from megatron.evaluation.stats import DAGGER, DOUBLE_DAGGER, format_mean_std, mean_std, paired_test


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
