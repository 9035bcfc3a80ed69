"""The gaps against model quality and the train length together (study/gap_vs_quality.py)."""
import math

import pytest

from megatron.evaluation.results import RunResult
from study.gap_vs_quality import GapPoint, corpus_name, fit, gap_quality_markdown, gap_quality_points

CORPUS = ("data/latex_full_text_document", "test", "non-overlapping", None, None, None)


def run(dataset, seed, L, head_loss, gap_at=None, window=None, windows=320, corpus=CORPUS):
    """kerple_log at train length L (windowed@L with `window`): position-wise loss head_loss at every position of its
    256-token windows; perplexity 50 at k x L (k = 1, 8, 32), times (1 + gap_at(k) / 100) for the windowed run."""
    name = "kerple_log" if window is None else f"kerple_log (window {window})"
    ppl = {k * L: 50.0 * (1 + (gap_at(k) if window else 0.0) / 100) for k in (1, 8, 32)}
    return RunResult(f"{dataset}_{name}_{seed}_{L}", name, dataset, seed, window, L, ppl, {256: (1, [head_loss] * 256)},
                     None, "shuffled", 1234, {}, {256: windows}, corpus=corpus)


def pair(dataset, seed, L, head_loss, gap):
    return [run(dataset, seed, L, head_loss), run(dataset, seed, L, head_loss, gap_at=lambda k: gap, window=L)]


def test_a_gap_that_follows_quality_alone_has_no_train_length_slope():
    """Two designs of one corpus: equal tokens (quality falls with L) and equal sequences (it rises).
    The windowed gap is -2 points per doubling of q whatever L is; the fit finds b = -2 and c = 0."""
    runs, seeds = [], (1, 2, 3)
    for design, losses in (("equal_tokens", {64: 4.0, 128: 4.2, 256: 4.4}), ("equal_seqs", {64: 4.0, 128: 3.8, 256: 3.6})):
        for L, loss in losses.items():
            for s in seeds:
                head = loss + 0.01 * s
                runs += pair(design, s, L, head, gap=-2.0 * head / math.log(2) - 0.1 * s)
    res = gap_quality_points(runs)
    assert list(res) == ["latex_full"] and res["latex_full"]["length"] == 256 and res["latex_full"]["head"] == 64
    pts = res["latex_full"]["points"][("windowed - full", 32)]
    assert len(pts) == 18 and {p.dataset for p in pts} == {"equal_tokens", "equal_seqs"}
    f = fit(pts)
    assert f["c"][0] == pytest.approx(0.0, abs=0.05) and f["b"][0] == pytest.approx(-2.0, abs=0.15)
    assert f["b"][2] < 1e-6 and f["c"][2] > 0.1
    md = gap_quality_markdown(res)
    assert "### latex_full" in md and "positions 0-63 of the windows at evaluation length 256" in md
    assert "| windowed - full | 32x | 18 |" in md and "| equal_seqs | 256 | 1 |" in md


def test_runs_on_other_windows_are_named_and_one_train_length_gives_no_corpus():
    runs = pair("trend", 1, 64, 4.0, -1.0) + pair("trend", 1, 128, 4.1, -0.5)
    runs += pair("v2", 2, 64, 4.0, -3.0)
    runs[-2].windows[256] = 512  # v2 scored 512 windows at 256 (--max-tokens): not the same text
    runs[-1].windows[256] = 512
    res = gap_quality_points(runs)["latex_full"]
    assert res["left_out"] == [("v2", 64, 2)]
    assert fit(res["points"][("windowed - full", 32)]) is None  # 2 points: no fit, a row of dashes
    assert "Left out (kerple_log scored on other windows" in gap_quality_markdown({"latex_full": res})
    assert gap_quality_points(pair("trend", 1, 64, 4.0, -1.0) + pair("trend", 2, 64, 4.1, -1.0)) == {}
    assert gap_quality_markdown({}).startswith("No corpus has paired gaps")


def test_collinear_quality_and_length_give_no_fit():
    pts = [GapPoint("d", L, s, 10.0 * L, -1.0 * s) for L in (64, 128, 256) for s in (1, 2)]  # q proportional to L
    assert fit(pts) is None
    pts = [GapPoint("d", L, s, 10.0 * L + s, -1.0 * s) for L in (64, 128, 256) for s in (1, 2)]
    assert abs(fit(pts)["r(q, L)"]) > 0.99


def test_corpus_names_say_what_differs_from_the_test_windows():
    assert corpus_name(CORPUS) == "latex_full"
    assert corpus_name(("data/web_text_document", "test", "non-overlapping", None, 2048, None)) == \
        "web (documents >= 2048 tokens)"
    assert corpus_name(("data/web_text_document", "validation", "sliding", 256, None, None)) == \
        "web (validation split, sliding, stride 256)"
    assert corpus_name(()) == "unknown"


def test_a_gap_that_follows_the_train_length_alone_has_no_quality_slope():
    runs = []
    for design, losses in (("equal_tokens", {64: 4.0, 128: 4.2, 256: 4.4}), ("equal_seqs", {64: 4.0, 128: 3.8, 256: 3.6})):
        for L, loss in losses.items():
            for s in (1, 2, 3):
                runs += pair(design, s, L, loss + 0.01 * s, gap=-0.5 * math.log2(L) + 0.02 * s)
    f = fit(gap_quality_points(runs)["latex_full"]["points"][("windowed - full", 8)])
    assert f["c"][0] == pytest.approx(-0.5, abs=0.02) and f["b"][0] == pytest.approx(0.0, abs=0.3)
    assert f["c"][2] < 1e-6 and f["L only"][3] > 0.9


def test_the_figure_has_one_panel_per_gap(tmp_path):
    from study.plots import plot_gap_vs_quality

    pts = [GapPoint(d, L, s, 40.0 + L / 8 + s, -0.5 * s) for d in ("a", "b") for L in (64, 256) for s in (1, 2)]
    path = plot_gap_vs_quality({("windowed - full", 8): pts, ("power - log", 32): pts[:3]}, str(tmp_path / "g.png"), "x")
    assert open(path, "rb").read(4) == b"\x89PNG"
    with pytest.raises(ValueError, match="no points"):
        plot_gap_vs_quality({}, str(tmp_path / "h.png"), "x")


def test_leaving_one_group_out_shows_what_a_group_carries():
    """Group `outlier` alone makes the gap follow q: without it the slope on q is gone."""
    from study.gap_vs_quality import leave_one_group_out

    pts = [GapPoint(d, L, s, 40.0 + 5 * s + L / 64, -1.0 + 0.01 * s) for d in ("a", "b") for L in (64, 256) for s in (1, 2, 3)]
    pts += [GapPoint("outlier", L, s, 200.0 + s + L / 64, -6.0) for L in (64, 256) for s in (1, 2, 3)]
    assert fit(pts)["b"][0] < -1.0
    out = leave_one_group_out(pts)
    assert sorted(out) == ["a", "b", "outlier"]
    assert abs(out["outlier"]["b"][0]) < 0.1 and out["a"]["b"][0] < -1.0
    assert leave_one_group_out([p for p in pts if p.dataset == "a"]) == {}
    md = gap_quality_markdown({"c": {"length": 256, "head": 64, "points": {("windowed - full", 32): pts}, "left_out": []}})
    assert "| windowed - full | 32x | outlier | 12 |" in md


def test_two_corpora_whose_files_share_a_name_stay_apart():
    other = ("other/latex_full_text_document", *CORPUS[1:])
    runs = pair("a", 1, 64, 4.0, -1.0) + pair("a", 1, 128, 4.1, -0.5)
    runs += [run("b", 1, L, 3.0, gap_at=(lambda k: -2.0) if w else None, window=w, corpus=other)
             for L in (64, 128) for w in (None, L)]
    assert sorted(gap_quality_points(runs)) == ["latex_full", "latex_full, other/latex_full_text_document"]


def test_a_config_trained_twice_is_one_point_of_the_fit():
    """Two designs share their L = 64 runs (the same config and seed): counted twice, those points would pull
    the fit; counted once (mean gap, geometric-mean q) the fit is the one over the distinct configs."""
    from study.gap_vs_quality import count_once, leave_one_group_out

    def pt(d, L, s, q, gap):
        trained = (("config", f"L{L}s{s}"),) if L == 64 else (("run", d, L, s),)
        return GapPoint(d, L, s, q, gap, trained)

    shared = {1: (40.0, -3.0), 2: (41.0, -2.0), 3: (42.0, -2.5)}
    pts = []
    for d, longer in (("tokens", {128: 50.0, 256: 60.0}), ("seqs", {128: 32.0, 256: 26.0})):
        for s, (q, gap) in shared.items():
            pts.append(pt(d, 64, s, q * (1.02 if d == "seqs" else 1.0), gap + (0.4 if d == "seqs" else 0.0)))
            for L, qL in longer.items():
                pts.append(pt(d, L, s, qL + s, -1.5 * math.log2(qL) / 6 + 0.1 * s - 0.2 * math.log2(L)))
    once = count_once(pts)
    assert len(pts) == 18 and len(once) == 15
    merged = {p.seed: p for p in once if p.train_length == 64}
    assert merged[1].gap == pytest.approx(-2.8) and merged[1].runs == 2 and merged[1].dataset == "seqs = tokens"
    assert merged[1].quality == pytest.approx(math.sqrt(40.0 * 40.8))
    f = fit(pts)
    assert f["n"] == 15
    distinct = [p for p in once]
    for key in ("b", "c"):
        assert f[key] == pytest.approx(fit(distinct)[key])
    twice = fit([GapPoint(p.dataset, p.train_length, p.seed, p.quality, p.gap) for p in pts])  # no identities
    assert twice["n"] == 18 and twice["b"][0] != pytest.approx(f["b"][0])
    # leaving one design out keeps the shared config, as the runs the other design trained
    without = leave_one_group_out(pts)["seqs"]
    assert without["n"] == 9
    assert without["b"] == pytest.approx(fit([p for p in pts if p.dataset == "tokens"])["b"])


def test_the_markdown_names_what_it_counted_once():
    pts = [GapPoint(d, 64, s, 40.0 + s, -1.0 - s, (("config", s),)) for d in ("x", "y") for s in (1, 2, 3)]
    pts += [GapPoint("x", L, s, 40.0 + L / 16 + s * 1.5, -0.5 * s) for L in (128, 256) for s in (1, 2, 3)]
    md = gap_quality_markdown({"c": {"length": 256, "head": 64, "points": {("windowed - full", 32): pts}, "left_out": []}})
    assert "| windowed - full | 32x | 9 |" in md  # 12 points, 3 of them a second run of the same config
    assert "Counted once in every fit: x L = 64 and y L = 64 trained the same config (seeds 1, 2, 3;" in md
