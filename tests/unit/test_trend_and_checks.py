"""The report's v3 sections computed from records: the train-length trend of the gaps, the
flat-kernel assessment and the train/test correlation."""
import json
import math

import numpy as np
import pytest

from megatron.evaluation.results import RunResult
from study.aggregate import table3_cells
from study.flat_kernels import FLAT_AT_L, flat_markdown, head_values
from study.train_test import final_train_ppl, pairs, train_test_markdown
from study.trend import gap_points, slope, trend_markdown


def run(scheme, seed, L, ppl_at, window=None):
    """A result at train length L with perplexity ppl_at(k) at k x L, k = 1, 8, 32."""
    name = scheme if window is None else f"{scheme} (window {window})"
    return RunResult(f"{name}_{seed}_{L}", name, "latex", seed, window, L, {k * L: ppl_at(k) for k in (1, 8, 32)})


def trend_runs():
    runs = []
    for L, gap in ((64, 0.10), (128, 0.05), (256, 0.0)):  # windowed beats full by 10%, 5%, 0% at 8x
        for seed in (1, 2, 3):
            full = 50.0 + seed
            runs.append(run("kerple_log", seed, L, lambda k, f=full: f))
            runs.append(run("kerple_log", seed, L, lambda k, f=full, g=gap: f * (1 - g) if k == 8 else f, window=L))
            if not (L == 256 and seed == 3):  # one power run still missing
                runs.append(run("kerple_power_ap_", seed, L, lambda k, f=full: f * 0.9))
    return runs


def test_gaps_against_the_train_length_with_missing_pairs_named():
    gaps = gap_points(trend_runs())
    w8 = gaps[("latex", "windowed - full", 8)]["points"]
    assert {L: [round(x, 9) for x in v.values()] for L, v in w8.items()} == {
        64: [-10.0] * 3, 128: [-5.0] * 3, 256: [0.0] * 3}
    per_doubling, _, p = slope(w8)
    assert per_doubling == pytest.approx(5.0) and p < 1e-6  # the gap shrinks by 5 points per doubling
    power = gaps[("latex", "power - log", 32)]
    assert sorted(power["points"][256]) == [1, 2] and power["points"][64][1] == pytest.approx(-10.0)
    assert power["missing"][256] == [(3, "kerple_power_ap_")] and power["missing"][64] == []
    assert ("latex", "windowed - full", 1) not in gaps  # a window of L over L tokens is full attention
    md = trend_markdown(gaps, table3_cells(trend_runs()))
    assert "| windowed - full | 8x | -10.0 ± 0.0 (n=3) | -5.0 ± 0.0 (n=3) | +0.0 ± 0.0 (n=3) | +5.0" in md
    assert "- power - log, L = 256: 3 (kerple_power_ap_)" in md
    assert "| power - log | 32x | 3 | -10.0 | -10.0 | – |" in md  # per seed: seed 3 has no power run at 256
    assert "- L = 64, kerple_power_ap_: 64 (1x), 512 (8x), 2048 (32x)" in md  # ‡ at every length (p < 0.05)


def test_planned_runs_without_a_record_are_named_missing(tmp_path):
    from study.experiments import write_matrix
    from study.trend import planned_runs

    runs = write_matrix(["kerple_log", "kerple_power_ap_"], {"latex": "d/latex"}, [1, 4], str(tmp_path / "m"), "r",
                        [], train_lengths=[128], tokens_per_step=1024)
    planned = planned_runs([str(tmp_path / "m" / "matrix.json")])
    assert ("latex", 128, "kerple_log", 4) in planned and len(planned) == len(runs) == 4
    gaps = gap_points(trend_runs(), planned)
    assert gaps[("latex", "power - log", 8)]["missing"][128] == [(4, "kerple_log"), (4, "kerple_power_ap_")]
    assert set(gaps[("latex", "windowed - full", 8)]["missing"][128]) == {(4, "kerple_log"),
                                                                          (4, "kerple_log (window 128)")}
    assert gaps[("latex", "windowed - full", 8)]["missing"][64] == []  # nothing planned there, all paired
    only_64 = [r for r in trend_runs() if r.train_length == 64]  # a planned length alone makes a trend table
    assert gap_points(only_64, planned)[("latex", "power - log", 8)]["missing"][128] == [
        (1, "kerple_log"), (1, "kerple_power_ap_"), (4, "kerple_log"), (4, "kerple_power_ap_")]


def test_a_planned_only_dataset_gets_one_line_not_a_table_of_dashes(tmp_path):
    from study.experiments import write_matrix
    from study.trend import has_points, planned_runs

    write_matrix(["kerple_log", "alibi"], {"code_warmup10": "d/code"}, [1], str(tmp_path / "m"), "r", [],
                 train_lengths=[64, 128], tokens_per_step=1024)
    gaps = gap_points(trend_runs(), planned_runs([str(tmp_path / "m" / "matrix.json")]))
    assert has_points(gaps, "latex") and not has_points(gaps, "code_warmup10")
    md = trend_markdown(gaps, table3_cells(trend_runs()))
    code, latex = md.split("## latex")  # sections in dataset order: code_warmup10 first
    assert code.split("## code_warmup10")[1].strip() == "No pair recorded yet (train lengths 64, 128 planned)."
    assert "| windowed - full | 8x | -10.0" in latex


def test_no_trend_from_one_train_length():
    runs = [r for r in trend_runs() if r.train_length == 64]
    assert gap_points(runs) == {}
    assert "two or more train lengths" in trend_markdown({}, [])
    assert slope({64: {1: 1.0, 2: 2.0}}) is None
    assert slope({64: {1: 1.0, 2: 2.0, 3: 1.5}, 128: {1: 9.0}}) is None  # one seed at 128: no slope yet


def write_record(tmp_path, name, scheme, seed, L, kernel=None, losses=None, test_ppl=10.0):
    d = tmp_path / name
    d.mkdir()
    if kernel is not None:
        (d / "kernel.json").write_text(json.dumps({"kernel": kernel}))
    (d / "eval.json").write_text(json.dumps({"results": [{"length": L, "ppl": test_ppl}]}))
    traj = {"iteration": list(range(10, 201, 10)), "lm_loss": losses or [5.0] * 20}
    return {"dataset": "web", "scheme": scheme, "label": scheme, "seed": seed, "train_length": L, "dir": str(d),
            "trajectory": traj}


def test_flat_kernel_assessment_reads_f_at_L_8L_32L(tmp_path):
    L = 4
    flat = [-0.1 * d for d in range(32 * L + 1)]  # f(L) = -0.4 >= -ln 2: flat
    steep = [-1.0 * d for d in range(32 * L + 1)]
    recs = [write_record(tmp_path, "a", "kerple_log", 1, L, [flat, steep]),
            write_record(tmp_path, "b", "alibi", 1, L, [steep])]  # not a KERPLE kernel: not assessed
    rows = head_values(recs)
    assert [(r["head"], r["flat"]) for r in rows] == [(0, True), (1, False)]
    assert rows[1]["f"] == {1: -4.0, 8: -32.0, 32: -128.0}
    md = flat_markdown(rows)
    assert "| web | 4 | kerple_log | 2 | 1 | -0.4 | -0.4 | -12.8 |" in md
    assert f"{FLAT_AT_L:.3f}" in md and "| web | 4 | kerple_log | 1 | 1 | -4 | -32 | -128 |" in md


def test_train_test_correlation_and_the_scheme_that_drives_it(tmp_path):
    recs = []
    for i, (scheme, train, test) in enumerate([("a", 10, 11), ("a", 11, 10), ("b", 12, 12.5), ("b", 12.5, 12),
                                               ("sinusoidal", 100, 300)]):
        losses = [9.0] * 10 + [math.log(train)] * 10  # the tail (last 100 steps) is what counts
        recs.append(write_record(tmp_path, f"r{i}", scheme, i, 64, losses=losses, test_ppl=test))
    assert final_train_ppl(recs[0]["trajectory"]) == pytest.approx(10.0)
    groups = pairs(recs)
    md = train_test_markdown(groups)
    xs, ys = [10, 11, 12, 12.5, 100], [11, 10, 12.5, 12, 300]
    assert f"| web | 64 | 5 | {np.corrcoef(xs, ys)[0, 1]:.3f} | sinusoidal: " in md
    assert f"sinusoidal: {np.corrcoef(xs[:4], ys[:4])[0, 1]:.3f}" in md  # without it, r is much lower


def test_a_gap_whose_scheme_the_dataset_never_trains_is_left_out():
    """trend_16seq trains kerple_log and kerple_power_ap_ only: no alibi - log rows listing every seed missing."""
    runs = [r for r in trend_runs() if r.scheme != "alibi"]
    gaps = gap_points(runs)
    assert not any(gap == "alibi - log" for _, gap, _ in gaps)
    assert ("latex", "power - log", 32) in gaps and ("latex", "windowed - full", 32) in gaps
    with_alibi = gap_points(runs + [run("alibi", 1, 64, lambda k: 60.0)])
    assert with_alibi[("latex", "alibi - log", 32)]["missing"][128] == [(1, "alibi"), (2, "alibi"), (3, "alibi")]
