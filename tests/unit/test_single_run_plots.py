"""The figures evaluate.py writes for one run (issue 45, item 6): a 2% drift stays small on the
perplexity axis, the position-wise curve is averaged over enough tokens a point and says over how
many windows, and the kernel figure is large enough to read and names the run and its step. The
report's many-run figures keep their own layout (study outputs stay byte-identical)."""
import json
from types import SimpleNamespace

import matplotlib.image
import numpy as np
import pytest

from megatron.evaluation import kernels, plots
from megatron.evaluation import sweep as evaluate
from megatron.evaluation.results import parse_result

QUICKSTART = {128: 122.499, 256: 121.677, 512: 122.031, 1024: 123.041, 2048: 124.266}  # README, +1.4% at 16x
TOKENS = 65536  # per length, as make quickstart


def fake_eval_json(path, ppl=QUICKSTART, pos_emb="kerple_log", iteration=400, checkpoint="/r/runs/quickstart/checkpoints"):
    """An eval.json as evaluate.py writes it: per length the windows that fit in TOKENS, and a
    position-wise curve of at most 256 bins whose loss falls with the position plus noise."""
    rng = np.random.default_rng(0)
    positionwise = {}
    for length in ppl:
        size = max(1, -(-length // 256))
        loss = np.log(ppl[length]) + 1.5 / np.sqrt(1 + np.arange(length // size) * size) + rng.normal(0, 0.05, length // size)
        positionwise[str(length)] = {"bin_size": size, "loss": loss.tolist()}
    results = [{"length": L, "loss": float(np.log(p)), "ppl": p, "windows": TOKENS // L, "windows_requested": TOKENS // L,
                "tokens": TOKENS, "seconds": 1.0} for L, p in ppl.items()]
    rec = {"schema": "kerple-eval/1", "pos_emb": pos_emb, "seed": 1234, "train_length": 128, "iteration": iteration,
           "checkpoint": checkpoint, "window": None, "window_order": "contiguous", "data_seed": 1234,
           "results": results, "positionwise": positionwise}
    with open(path, "w") as f:
        json.dump(rec, f)
    return str(path)


@pytest.fixture
def single_run(tmp_path, monkeypatch):
    """Runs evaluate.write_plots on the quickstart figures; returns ({file name: figure}, [paths])."""
    figures = {}
    save = plots.save_figure

    def keep(fig, path):
        figures[path.rsplit("/", 1)[-1]] = fig
        fig.canvas.draw()  # before save_figure closes it: tick labels are made at draw time
        return save(fig, path)

    monkeypatch.setattr(plots, "save_figure", keep)
    heads = np.stack([-0.5 * np.log1p(0.3 * h * np.arange(2049.0)) for h in range(1, 5)])
    monkeypatch.setattr(kernels, "kernel_of_scheme", lambda position, max_distance: heads)
    cfg = SimpleNamespace(model=SimpleNamespace(pos_emb="kerple_log", seq_length=128))
    paths = evaluate.write_plots(fake_eval_json(tmp_path / "eval.json"), SimpleNamespace(position=None), cfg, 2048,
                                 str(tmp_path), "quickstart")
    yield figures, paths
    plots.plt.close("all")


def test_a_two_percent_rise_stays_small_on_the_perplexity_axis(single_run):
    figures, _ = single_run
    ax = figures["ppl_vs_length.png"].axes[0]
    lo, hi = ax.get_ylim()
    assert ax.get_yscale() == "log" and hi / lo >= plots.PPL_MIN_SPAN  # was ~1.03: 122-125 filled the height
    assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2  # the paper's length axis
    height = (np.log(124.266) - np.log(122.499)) / (np.log(hi) - np.log(lo))
    assert height < 0.03  # the 16x rise is under 3% of the axis height
    assert "+1.4% (16x vs 1x)" in [t.get_text() for t in ax.texts]
    assert ax.get_title() == "quickstart, step 400: perplexity vs length"
    right = ax.child_axes  # secondary_yaxis
    assert right and right[0].get_ylabel() == "perplexity / perplexity at length 128 (1x)"


def test_a_large_change_keeps_its_autoscaled_range(tmp_path):
    """Rotary's 127 -> 168 (+32%) is drawn as it is: the minimum span only widens narrow ranges."""
    rotary = {128: 127.222, 256: 129.54, 512: 137.78, 1024: 150.35, 2048: 168.002}
    run = parse_result(fake_eval_json(tmp_path / "eval.json", rotary, "rotary"))
    ax = plots.ppl_vs_length_figure([run], min_span=plots.PPL_MIN_SPAN).axes[0]
    lo, hi = ax.get_ylim()
    assert hi / lo == pytest.approx(plots.PPL_MIN_SPAN) and lo < 127 and hi > 168
    assert "+32.1% (16x vs 1x)" in [t.get_text() for t in ax.texts]
    plots.plt.close("all")


def test_positionwise_points_average_enough_tokens_and_name_the_windows(single_run):
    figures, _ = single_run
    ax = figures["positionwise.png"].axes[0]
    curve = next(line for line in ax.get_lines() if line.get_label().startswith("kerple_log"))
    assert curve.get_label() == "kerple_log, mean of 32 windows"  # 65536 tokens / 2048
    assert "length 2048" in ax.get_title() and "at least 8192 scored tokens" in ax.get_title()
    assert ax.get_title().startswith("quickstart, step 400: ")
    assert "32 windows: the points differ by the text they cover too" in ax.get_title()
    # 32 windows x 8 positions a stored bin = 256 tokens: a point needs 32 bins, 256 positions; the first
    # point was position 4 alone (256 tokens) before
    x = np.asarray(curve.get_xdata())
    assert x[0] >= 128  # the mean position of at least positions 0-255
    assert len(x) <= 2048 // 256


def test_kernel_figure_is_readable_and_names_the_run_and_step(single_run):
    figures, paths = single_run
    png = next(p for p in paths if p.endswith("kernels.png"))
    height, width = matplotlib.image.imread(png).shape[:2]
    assert width >= 800 and height >= 560  # was 420x320
    ax = figures["kernels.png"].axes[0]
    assert ax.get_title() == "quickstart: kerple_log, step 400"
    assert ax.title.get_fontsize() >= 12 and ax.xaxis.label.get_fontsize() >= 12
    assert min(t.get_fontsize() for t in ax.get_xticklabels()) >= 11
    assert min(t.get_fontsize() for t in ax.get_legend().get_texts()) >= 10


def test_the_report_figures_keep_their_layout(tmp_path, monkeypatch):
    """Without the single-run options (study/aggregate.py, tools/make_report.py) nothing changes:
    the axis is zoomed on the data and points follow the 32 log-spaced bins."""
    run = parse_result(fake_eval_json(tmp_path / "eval.json"))
    lo, hi = plots.ppl_vs_length_figure([run]).axes[0].get_ylim()
    assert hi / lo < 1.1
    ax = plots.positionwise_figure([run], 2048).axes[0]
    assert ax.get_lines()[0].get_label() == "kerple_log" and ax.get_lines()[0].get_xdata()[0] == 4
    seen = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: seen.append(fig) or path)
    plots.plot_kernels({"kerple_log": -np.log1p(np.arange(65.0))[None, :]}, str(tmp_path / "k.png"), 64, "latex")
    assert tuple(seen[0].get_size_inches()) == (4.2, 3.2) and seen[0].axes[0].title.get_fontsize() == 8
    plots.plt.close("all")


def test_checkpoint_name_is_the_run_directory():
    from megatron.evaluation.outputs import checkpoint_name

    assert checkpoint_name("runs/quickstart/checkpoints") == "quickstart"
    assert checkpoint_name("runs/quickstart/checkpoints/") == "quickstart"
    assert checkpoint_name("/x/my_model") == "my_model"
