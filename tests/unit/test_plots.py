"""Readable plots: every tick shown on a log-scale perplexity axis has a number, whatever the
range (inside one decade, across several), and the train length is marked."""
import numpy as np
import pytest

from megatron.evaluation import plots
from megatron.evaluation.results import RunResult
from study import plots as study_plots

LENGTHS = (32, 64, 128, 256, 512, 1024)


def record(scheme, lo, hi, seed=1, train_length=64):
    ppl = dict(zip(LENGTHS, np.geomspace(lo, hi, len(LENGTHS)).tolist()))
    curve = np.log(np.geomspace(hi, lo, 256)).tolist()  # per-position loss: exp() spans hi..lo
    return RunResult(path=f"{scheme}_{seed}", scheme=scheme, dataset="code", seed=seed, window=None,
                     train_length=train_length, ppl=ppl, positionwise={1024: (4, curve)})


def shown(ax, which):
    """(value, label) of the y ticks inside the visible range, after drawing."""
    ax.figure.canvas.draw()
    lo, hi = ax.get_ylim()
    axis = ax.yaxis
    locs = axis.get_majorticklocs() if which == "major" else axis.get_minorticklocs()
    labels = ax.get_yticklabels(minor=which == "minor")
    texts = {round(t.get_position()[1], 9): t.get_text() for t in labels}
    return [(v, texts.get(round(v, 9), "")) for v in locs if lo <= v <= hi]


@pytest.mark.parametrize("lo,hi", [(110, 190), (120, 1330), (2.5, 4e4), (1.02, 1.08), (954, 1100)])
@pytest.mark.parametrize("kind", ["ppl_vs_length", "positionwise"])
def test_every_visible_tick_has_a_number(lo, hi, kind):
    records = [record("kerple_log", lo, hi), record("alibi", lo * 1.01, hi * 0.99)]
    if kind == "ppl_vs_length":
        fig = plots.ppl_vs_length_figure(records)
    else:
        fig = plots.positionwise_figure(records, 1024)
    ax = fig.axes[0]
    major = shown(ax, "major")
    assert len(major) >= 3, major  # enough numbers to read a value off the axis
    for v, text in major + shown(ax, "minor"):
        assert text.strip(), f"tick {v} has no label in range {lo}-{hi}: {major}"
        assert float(text.replace("\u2212", "-")) == pytest.approx(v, rel=1e-3)  # plain numbers, no 10^x
    plots.plt.close(fig)


@pytest.mark.parametrize("kind", ["ppl_vs_length", "positionwise"])
def test_train_length_is_marked(kind):
    records = [record("kerple_log", 110, 190, seed=s) for s in (1, 2)]
    fig = plots.ppl_vs_length_figure(records) if kind == "ppl_vs_length" else plots.positionwise_figure(records, 1024)
    ax = fig.axes[0]
    marks = [line for line in ax.get_lines() if "train length" in line.get_label()]
    assert len(marks) == 1 and "64" in marks[0].get_label()
    assert set(np.asarray(marks[0].get_xdata(), dtype=float)) == {64.0}
    assert "train length 64" in [t.get_text() for t in ax.get_legend().get_texts()]
    plots.plt.close(fig)


def test_plot_files_are_still_written(tmp_path):
    records = [record("kerple_log", 110, 190)]
    for path in (plots.plot_ppl_vs_length(records, str(tmp_path / "a.png")),
                 plots.plot_positionwise(records, str(tmp_path / "b.png"))):
        assert open(path, "rb").read(4) == b"\x89PNG"


def windowed_record(scheme, lo, hi, window=64):
    r = record(scheme, lo, hi)
    r.scheme, r.window = f"{scheme} (window {window})", window
    return r


def colours_by_label(fig):
    return {line.get_label(): (line.get_color(), line.get_linestyle()) for line in fig.axes[0].get_lines()}


def test_a_scheme_has_one_colour_in_both_figures_and_the_baseline_is_dashed_black():
    plain = [record(s, 40, 40 * k) for k, s in enumerate(["xpos", "alibi", "rotary", "kerple_log"], start=2)]
    base = windowed_record("kerple_log", 35, 60)
    by_length = colours_by_label(plots.ppl_vs_length_figure([*plain, base]))
    by_position = colours_by_label(plots.positionwise_figure(plain, 1024, windowed=[base]))
    for r in plain:
        assert by_length[r.scheme] == by_position[r.scheme] and by_length[r.scheme][1] == "-"
    assert len({by_length[r.scheme][0] for r in plain}) == len(plain)  # distinguishable
    baseline = "kerple_log (window 64) (baseline)"
    assert by_length[baseline] == by_position[baseline] == ("black", "--")
    # a windowed run handed to positionwise among the plain ones is still drawn as the baseline
    assert colours_by_label(plots.positionwise_figure([*plain, base], 1024))[baseline] == ("black", "--")
    plots.plt.close("all")


def test_ratio_panel_keeps_the_others_readable_when_one_scheme_fails():
    plain = [record("kerple_log", 40, 44), record("alibi", 40, 48), record("sinusoidal", 400, 40000)]
    base = windowed_record("kerple_log", 40, 42)
    for fig in (plots.ppl_vs_length_figure([*plain, base]), plots.positionwise_figure(plain, 1024, windowed=[base])):
        assert len(fig.axes) == 2
        ratio = fig.axes[1]
        lo, hi = ratio.get_ylim()
        assert lo < 1.0 < 48 / 42 < hi < 1.2 < plots.RATIO_TOP  # zoomed on the readable schemes, 1 = the baseline
        assert ratio.get_legend().get_title().get_text() == "above the axis: sinusoidal"
        alibi = next(line for line in ratio.get_lines() if line.get_label() == "alibi")
        assert 1.0 < max(alibi.get_ydata()) < 1.2  # 48 / 42 at the longest length
    assert len(plots.ppl_vs_length_figure(plain).axes) == 1  # no baseline, no ratio panel
    plots.plt.close("all")


def test_kernels_on_a_log_distance_axis_with_the_domain_in_the_title(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: seen.setdefault("fig", fig) and path)
    f = -np.log1p(np.arange(65.0))[None, :].repeat(2, 0)
    plots.plot_kernels({"kerple_log (seed 1)": f}, str(tmp_path / "k.png"), 64, "latex, train length 64")
    ax = seen["fig"].axes[0]
    assert ax.get_xscale() == "log" and ax.get_title() == "latex, train length 64: kerple_log (seed 1)"
    assert min(ax.get_lines()[0].get_xdata()) == 1  # d = 0 has no place on a log axis
    plots.plt.close("all")


def test_trajectories_draw_the_heads_over_the_drift_target(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr(study_plots, "save_figure", lambda fig, path: seen.setdefault("fig", fig) and path)
    panels = {"kerple_log bias_p (seed 1)": ([10, 20, 30], {0: [1.0, 1.0, 1.0], 1: [1.0, 1.0, 2.0]})}
    study_plots.plot_trajectories(panels, str(tmp_path / "t.png"), "web", {"kerple_log bias_p (seed 1)": {1: 0.5}})
    lines = {line.get_label(): line.get_linewidth() for line in seen["fig"].axes[0].get_lines()}
    assert lines["head 1: 50.0% in last 20%"] > lines["head 0"]
    assert seen["fig"].axes[0].get_title().startswith("web: ")
    plots.plt.close("all")
