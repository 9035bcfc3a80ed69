"""Model quality against the train length on the same windows (study/train_length_quality.py)."""
import math

import pytest

from megatron.evaluation.results import RunResult
from study.train_length_quality import changes, quality_markdown, quality_points


def run(seed, L, loss_at, windows=320, scheme="kerple_log", window=None, dataset="latex"):
    """Full-attention result at train length L scored at 256 and 512 with `windows` windows each;
    loss_at(position) is its position-wise loss (256 bins: bin size 1 at 256, 2 at 512)."""
    pw = {n: (n // 256, [loss_at(b * (n // 256)) for b in range(256)]) for n in (256, 512)}
    ppl = {n: math.exp(sum(pw[n][1]) / 256) for n in (256, 512)}
    name = scheme if window is None else f"{scheme} (window {window})"
    return RunResult(f"{name}_{seed}_{L}", name, dataset, seed, window, L, ppl, pw, None, "shuffled", 1234, {},
                     {n: windows for n in ppl})


def test_longer_train_length_worse_everywhere_is_measured_on_the_same_windows():
    # L = 64: loss 4.0 everywhere; L = 128: 4.1 before position 64 and 4.2 from it (worse where L = 64 extrapolates)
    runs = [run(s, 64, lambda p: 4.0) for s in (1, 2)] + [run(s, 128, lambda p: 4.1 if p < 64 else 4.2) for s in (1, 2)]
    runs.append(run(1, 64, lambda p: 9.0, window=64))  # a windowed evaluation is not a trained model: left out
    points = quality_points(runs)
    assert set(points) == {("latex", "kerple_log", 256), ("latex", "kerple_log", 512)}
    by_L = points[("latex", "kerple_log", 256)]
    assert sorted(by_L) == [64, 128] and sorted(by_L[128]) == [1, 2]
    whole, late = changes(by_L)[128], changes(by_L, late=True)[128]
    assert whole == pytest.approx([100 * (math.exp((64 * 0.1 + 192 * 0.2) / 256) - 1)] * 2)
    assert late == pytest.approx([100 * (math.exp(0.2) - 1)] * 2)  # positions 64..255 only
    md = quality_markdown(points)
    assert "| kerple_log | 256 | 54.60 ± 0.00 | " in md and "| +22.1 ± 0.0 (n=2) |" in md  # e^4, e^0.2


def test_lengths_scored_on_different_windows_are_not_compared():
    """v2's L = 64 runs scored 512 windows at 256 (--max-tokens), the trend's L = 128 runs 320: not the
    same text, so no row; nor a length that one train length did not score."""
    runs = [run(1, 64, lambda p: 4.0, windows=512), run(1, 128, lambda p: 4.2)]
    assert quality_points(runs) == {}
    assert quality_markdown({}).startswith("No scheme has full-attention runs of two train lengths")
    three = [run(1, 64, lambda p: 4.0), run(1, 128, lambda p: 4.1), run(1, 256, lambda p: 4.2)]
    three[2].ppl.pop(256)  # L = 256 lacks this length: the row would have no L = 256 cell, so none
    assert set(quality_points(three)) == {("latex", "kerple_log", 512)}


def test_a_seed_missing_at_the_shortest_length_has_no_change():
    runs = [run(1, 64, lambda p: 4.0), run(1, 128, lambda p: 4.1), run(2, 128, lambda p: 4.3)]
    by_L = quality_points(runs)[("latex", "kerple_log", 512)]
    assert changes(by_L)[128] == pytest.approx([100 * (math.exp(0.1) - 1)])  # seed 2 has no L = 64 partner
    assert "+10.5 (n=1)" in quality_markdown(quality_points(runs))


def test_table3_says_how_long_each_group_trained_and_where_it_was_scored(tmp_path):
    """Issue 24: GPU records on a short schedule are marked as such in the report."""
    from dataclasses import replace

    from study.aggregate import provenance, write_report

    gpu = [replace(run(s, 512, lambda p: 3.0, scheme=k, dataset="code_162M"), iteration=500,
                   device_name="cuda:0 (NVIDIA H100 80GB HBM3)") for s in (1, 2) for k in ("kerple_log", "alibi")]
    cpu = [replace(run(s, 64, lambda p: 4.0, scheme=k), iteration=2000) for s in (1, 2) for k in ("kerple_log", "alibi")]
    assert provenance(gpu) == "Checkpoints at step 500; evaluated on cuda:0 (NVIDIA H100 80GB HBM3)."
    assert provenance(cpu) == "Checkpoints at step 2,000." and provenance([replace(cpu[0], iteration=None)]) == ""
    write_report(gpu + cpu, str(tmp_path), log=lambda *_: None)
    table = (tmp_path / "table3.md").read_text()
    gpu_section = table.split("## code_162M, train length 512")[1].split("## ")[0]
    assert "Checkpoints at step 500; evaluated on cuda:0 (NVIDIA H100 80GB HBM3)." in gpu_section
    assert "Checkpoints at step 2,000." in table.split("## latex, train length 64")[1]


def test_loss_over_a_position_range_needs_bin_bounds():
    r = run(1, 64, lambda p: 4.0 if p < 64 else 5.0)  # bins of 2 positions at 512
    assert r.loss_over(512, 64) == pytest.approx(5.0) and r.loss_over(512, 0, 64) == pytest.approx(4.0)
    assert r.loss_over(512, 63) is None and r.loss_over(512, 0, 65) is None  # a bound inside a bin
    assert r.loss_over(512, 0, 1024) is None and r.loss_over(1024, 0) is None and r.loss_over(512, 64, 64) is None
