"""The claims behind the study's report (study/claims.py): the computations the prose rests on,
each checked against a case whose answer is known."""
import math

import pytest
from scipy import stats as sps

from megatron.evaluation.results import RunResult
from study.claims import Claims, Study, extrapolation_claims, log_runs, log_scale_claims, slope_ci, tight

LENGTHS = (64, 128, 256, 512, 1024, 2048)


def run(scheme, dataset, seed, ppl):
    return RunResult(f"{dataset}/{scheme}/{seed}", scheme, dataset, seed, None, 64, dict(ppl))


def test_the_log_scale_check_names_a_row_one_outlying_seed_hides_on_perplexity():
    """Sinusoidal is e^2 to e^2.3 times kerple_log's perplexity on seven seeds and e^4 on the eighth. On
    perplexity that seed's difference dwarfs the rest and the row is not significant; on log-perplexity
    (the ratio) every seed is clearly worse and the row is Holm-significant at every length."""
    logs = (2.0, 2.05, 2.1, 2.15, 2.2, 2.25, 2.3, 4.0)
    runs = []
    for seed, lg in enumerate(logs):
        base = {L: 50.0 + seed + L / 1000 for L in LENGTHS}
        runs += [run("kerple_log", "code", seed, base), run("sinusoidal", "code", seed,
                                                             {L: v * math.exp(lg + 0.001 * L / 64) for L, v in base.items()})]
    raw = sps.ttest_rel([r.ppl[64] for r in runs[0::2]], [r.ppl[64] for r in runs[1::2]]).pvalue
    on_log = sps.ttest_rel([math.log(r.ppl[64]) for r in runs[0::2]], [math.log(r.ppl[64]) for r in runs[1::2]]).pvalue
    assert raw > 0.05 and on_log * 6 < 0.05  # the case is what it claims to be, by scipy alone
    assert log_runs(runs)[1].ppl[64] == pytest.approx(math.log(runs[1].ppl[64]))
    c = Claims()
    log_scale_claims(c, Study(runs, []))
    assert c["log_scale_check"].value == ("the same count of Holm-significant lengths in 0 of 1 rows; it differs "
                                          "(perplexity -> log-perplexity) in code L = 64 sinusoidal (0 -> 6 of 6)")
    assert c["code_sin_log_holm_lengths"].value == "1x, 2x, 4x, 8x, 16x, 32x"
    assert "latex_sin_log_holm_lengths" not in c  # no row, no claim


def test_a_slope_is_tight_only_when_its_interval_rules_out_the_gap_vanishing_or_doubling():
    from study.trend import slope

    flat = {64: {1: -1.0, 2: -1.1, 3: -0.9}, 128: {1: -1.05, 2: -0.95, 3: -1.0}, 256: {1: -1.0, 2: -1.02, 3: -0.98}}
    noisy = {64: {1: -1.0, 2: -3.0, 3: 0.5}, 128: {1: -4.0, 2: 0.0, 3: -1.0}, 256: {1: -5.0, 2: 0.5, 3: -1.0}}
    closing = {64: {1: -2.0, 2: -2.1, 3: -1.9}, 128: {1: -1.0, 2: -1.1, 3: -0.9}, 256: {1: 0.0, 2: -0.1, 3: 0.1}}
    for pts, expected in ((flat, True), (noisy, False), (closing, False)):
        s = slope(pts)
        xs = [math.log2(L) for L, v in pts.items() for _ in v]
        ys = [g for v in pts.values() for g in v.values()]
        res = sps.linregress(xs, ys)
        half = sps.t.ppf(0.975, len(xs) - 2) * res.stderr
        assert slope_ci(pts, s) == pytest.approx((res.slope - half, res.slope + half))
        assert tight(pts, s) is expected


def test_perplexity_beyond_the_train_length_is_counted_per_run_and_tested_per_scheme():
    runs = []
    for d, factor in (("code", 0.85), ("latex", 0.9), ("web", 1.15)):
        for scheme in ("kerple_log", "alibi", "kerple_power_ap_"):
            for seed, jitter in ((1, 1.0), (2, 1.02), (3, 0.97)):
                last = factor * jitter if not (d == "web" and scheme == "kerple_power_ap_" and seed == 1) else 0.99
                runs.append(run(scheme, d, seed, {64: 40.0 * jitter, 2048: 40.0 * jitter * last}))
    c = Claims()
    extrapolation_claims(c, Study(runs, []))
    assert [c[f"{d}_ppl_32x_lower"].value for d in ("code", "latex", "web")] == ["9 of 9", "9 of 9", "1 of 9"]
    first = [40.0 * j for j in (1.0, 1.02, 0.97)]
    t = sps.ttest_rel(first, [v * 0.85 * j for v, j in zip(first, (1.0, 1.02, 0.97))])
    changes = [100 * (0.85 * j - 1) for j in (1.0, 1.02, 0.97)]  # -15, -13.3, -17.55
    text = c["code_log_32x_vs_1x"].value
    assert text.startswith(f"{sum(changes) / 3:+.1f} ± 2.1% (3 of 3 seeds lower; ") and f"p = {t.pvalue:.2g}," in text
    assert "Holm over the 9" in c["code_log_32x_vs_1x"].test
