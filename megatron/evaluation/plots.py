"""PNG figures for the report (matplotlib, Agg backend so it runs headless in CI).

- plot_ppl_vs_length: perplexity against evaluation length, one line per scheme (mean over seeds,
  ±1 std band), log-scale y, log2 x: the paper's main extrapolation picture.
- plot_positionwise: Fig. 5, per-position perplexity exp(loss) at one length, plus the windowed
  baseline (a run evaluated with --window) drawn dashed when given.
  With a windowed baseline both get a second panel: each scheme's perplexity divided by the
  baseline's (seed-paired), on an axis zoomed on the ratios below RATIO_TOP so one failing scheme
  (sinusoidal) does not flatten the others; the schemes above it are named in the panel.
- plot_kernels: Figs. 2-4, the learned bias f_h(d) of every head against distance d (log axis).
The study's figures over many runs (trajectories, trends, gaps against quality) are
study/plots.py, built on this module's helpers.
Each scheme keeps one colour across a report's figures (scheme_colors) and the windowed baseline is
black and dashed in both perplexity figures. Figures are small (dpi 100) so result folders stay
light in git. Log-scale perplexity axes carry a plain number on every tick for any range
(ReadableLogLocator), and the train length is marked on the first two plots (beyond it the model
extrapolates).
"""
from __future__ import annotations

import math
import os
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import FuncFormatter, Locator, MaxNLocator, NullLocator  # noqa: E402

from megatron.atomic_io import atomic_output  # noqa: E402

DPI = 100
PLAIN = FuncFormatter(lambda v, _: f"{v:g}")  # 1024 and 12.5 rather than 2^10 and 1.25x10^1
# Mantissas per decade, sparsest first: the first set that puts MIN_TICKS ticks in view is used.
LOG_SUBS = ((1,), (1, 3), (1, 2, 5), (1, 2, 3, 5, 7), (1, 1.5, 2, 3, 4, 5, 6, 7, 8, 9))
MIN_TICKS, MAX_TICKS = 5, 10
TRAIN_LINE = {"color": "0.35", "ls": ":", "lw": 1.2}
BASELINE_LINE = {"color": "black", "ls": "--", "lw": 1.2}  # the windowed baseline (a run with r.window)
RATIO_TOP = 2.0  # the ratio panels' y axis stops here (relative to the windowed baseline)
# One run's figures (evaluate.py) and a comparison of a few (tools/compare_runs.py): a single run has
# no spread over seeds to show, so an auto-zoomed axis would make any drift look like a climb.
PPL_MIN_SPAN = 2.0  # the perplexity axis spans at least this factor: a 2% change stays 3% of its height
# Each position-wise point averages at least this many scored tokens: at the quickstart's 2048 (32
# windows) 2048 tokens a point still swung 100-170 with the text a bin covers; 8192 (>= 256
# positions a point there) leaves the trend readable. Few windows are said on the plot too.
MIN_TOKENS_PER_POINT = 8192
FEW_WINDOWS = 100  # below this many windows the title says the points differ by their text
KERNEL_PANEL_SINGLE = (8.0, 5.6)  # inches: one readable panel (800x560 px at DPI)
KERNEL_FONT_SINGLE = 12
KERNEL_SYMLOG_ABOVE = 1e4  # |f_h(d)| beyond this: symlog y, so heads of very different scales stay visible


class ReadableLogLocator(Locator):
    """Ticks for a log axis that are all labelled with plain numbers: decades (1, 10, 100) when the
    range spans many, then 1-2-5 style mantissas, and inside a narrow range (110-190, where a log
    axis has no decade tick at all) evenly spaced round numbers. No unlabelled minor ticks."""

    def __call__(self):
        return self.tick_values(*self.axis.get_view_interval())

    def tick_values(self, vmin, vmax):
        lo, hi = sorted((vmin, vmax))
        if not (lo > 0 and math.isfinite(hi)):
            return []
        decades = range(math.floor(math.log10(lo)), math.floor(math.log10(hi)) + 1)
        for subs in LOG_SUBS:
            ticks = [m * 10.0**e for e in decades for m in subs if lo <= m * 10.0**e <= hi]
            if len(ticks) >= MIN_TICKS:
                return ticks[::math.ceil(len(ticks) / MAX_TICKS)]  # thinned only over very many decades
        # Under one decade's worth of 1-9 ticks: round numbers, evenly spaced in value.
        return [t for t in MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10]).tick_values(lo, hi) if lo <= t <= hi]


def readable_log_y(ax) -> None:
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(ReadableLogLocator())
    ax.yaxis.set_major_formatter(PLAIN)
    ax.yaxis.set_minor_locator(NullLocator())


def mark_train_length(ax, records) -> None:
    """A dotted vertical line at each train length of the records (one for the usual single one)."""
    for L in sorted({r.train_length for r in records if r.train_length}):
        ax.axvline(L, **TRAIN_LINE, label=f"train length {L}")


def save_figure(fig, path: str) -> str:
    fig.tight_layout()
    with atomic_output(path, fsync=False) as tmp:  # the format from `path`: the temporary name has none
        fig.savefig(tmp, dpi=DPI, format=os.path.splitext(path)[1].lstrip(".") or "png")
    plt.close(fig)
    return path


def _by_scheme(records) -> dict[str, list]:
    groups = defaultdict(list)
    for r in records:
        groups[r.scheme].append(r)
    return dict(sorted(groups.items()))


def scheme_colors(records) -> dict[str, str]:
    """One colour per scheme, from the sorted names of the records without a window: a report draws
    its figures from the same records, so a scheme has the same colour in each of them."""
    names = sorted({r.scheme for r in records if r.window is None})
    palette = plt.get_cmap("tab10" if len(names) <= 10 else "tab20").colors
    return {name: matplotlib.colors.to_hex(palette[i % len(palette)]) for i, name in enumerate(names)}


def _split_baseline(records) -> tuple[list, list]:
    return [r for r in records if r.window is None], [r for r in records if r.window is not None]


def plot_ppl_vs_length(records, path: str, title: str | None = None, min_span: float | None = None) -> str:
    """One line per scheme: mean perplexity over seeds at each length, shaded ±1 sample std.
    min_span (e.g. PPL_MIN_SPAN): see ppl_vs_length_figure."""
    return save_figure(ppl_vs_length_figure(records, title, min_span), path)


def widen_log_y(ax, min_span: float) -> None:
    """Make the (log) y axis span at least a factor min_span, centred on what it shows now."""
    lo, hi = ax.get_ylim()
    if hi / lo < min_span:
        centre, half = math.sqrt(lo * hi), math.sqrt(min_span)
        ax.set_ylim(centre / half, centre * half)


def reference_length(runs) -> tuple[int, bool]:
    """The length a run's change is measured from, and whether it is the train length (1x): its train
    length when evaluated there, else its shortest length."""
    lengths = sorted({L for r in runs for L in r.ppl})
    train = {r.train_length for r in runs}
    if len(train) == 1 and next(iter(train)) in lengths:
        return next(iter(train)), True
    return lengths[0], False


def reference_name(length: int, ref: int, is_train: bool) -> str:
    return f"{length / ref:g}x vs 1x" if is_train else f"vs length {ref}"


def change_vs_reference(ax, lengths, mean, runs, color) -> None:
    """Write the last point's change from the reference length's beside it, e.g. '+1.5% (16x vs 1x)'."""
    ref, is_train = reference_length(runs)
    base = mean[list(lengths).index(ref)]
    ax.annotate(f"{mean[-1] / base - 1:+.1%} ({reference_name(lengths[-1], ref, is_train)})",
                (lengths[-1], mean[-1]), xytext=(-4, 6), textcoords="offset points", ha="right", fontsize=8,
                color=color)


def _ratio_axis(ax, off_scale: list[str], xlabel: str, title: str) -> None:
    """The ratio panel's axes: log2 x, log y zoomed on the ratios up to RATIO_TOP, 1 = the baseline."""
    ax.axhline(1.0, **BASELINE_LINE, label="windowed baseline = 1")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(PLAIN)
    readable_log_y(ax)
    shown = [y for line in ax.get_lines() for y in np.atleast_1d(line.get_ydata()) if 0 < y <= RATIO_TOP] or [1.0]
    ax.set_ylim(min(min(shown), 1.0) * 0.99, min(max(max(shown), 1.0) * 1.02, RATIO_TOP))  # zoomed on the shown
    ax.set_xlabel(xlabel)
    ax.set_ylabel("perplexity / windowed baseline")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, title_fontsize=7, title="above the axis: " + ", ".join(off_scale) if off_scale else None)


def _paired_ratio(runs, baseline_runs, length: int) -> list[float]:
    """Each seed's perplexity at `length` over the baseline's of the same seed."""
    base = {r.seed: r.ppl[length] for r in baseline_runs if length in r.ppl}
    return [r.ppl[length] / base[r.seed] for r in runs if length in r.ppl and r.seed in base]


def ppl_vs_length_figure(records, title: str | None = None, min_span: float | None = None):
    """With min_span (a single run or a few compared, no seeds to show a spread): the y axis spans at
    least that factor, each line's change from its 1x length is written at its end, and for one
    scheme a right-hand axis gives perplexity relative to 1x."""
    plain, baseline = _split_baseline(records)
    fig, axes = plt.subplots(1, 2 if baseline else 1, figsize=(12.0 if baseline else 6.4, 4.2), squeeze=False)
    ax = axes[0][0]
    colors = scheme_colors(plain)
    for group, style in ((plain, None), (baseline, BASELINE_LINE)):
        for scheme, runs in _by_scheme(group).items():
            lengths = sorted({L for r in runs for L in r.ppl})
            vals = [[r.ppl[L] for r in runs if L in r.ppl] for L in lengths]
            mean = np.array([np.mean(v) for v in vals])
            std = np.array([np.std(v, ddof=1) if len(v) > 1 else 0.0 for v in vals])
            line_style = style or {"color": colors[scheme], "lw": 1.5}
            label = scheme if style is None else f"{scheme} (baseline)"
            ax.plot(lengths, mean, marker="o", ms=3, label=label, **line_style)
            ax.fill_between(lengths, np.maximum(mean - std, 1e-9), mean + std, color=line_style["color"], alpha=0.2)
            if min_span and len(lengths) > 1:
                change_vs_reference(ax, lengths, mean, runs, line_style["color"])
    mark_train_length(ax, records)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(PLAIN)
    readable_log_y(ax)
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("perplexity")
    ax.set_title(title or "perplexity vs length")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    if min_span:
        widen_log_y(ax, min_span)
        if len(_by_scheme(records)) == 1:
            relative_axis(ax, records)
    if baseline:
        ratio_by_length_panel(axes[0][1], plain, baseline, colors, title)
    return fig


def relative_axis(ax, runs) -> None:
    """A right-hand y axis: the perplexity divided by the run's value at its reference length (1x)."""
    ref, is_train = reference_length(runs)
    base = float(np.mean([r.ppl[ref] for r in runs]))
    right = ax.secondary_yaxis("right", functions=(lambda y: y / base, lambda q: q * base))
    right.yaxis.set_major_locator(ReadableLogLocator())
    right.yaxis.set_major_formatter(PLAIN)
    right.yaxis.set_minor_locator(NullLocator())
    right.set_ylabel(f"perplexity / perplexity at length {ref}" + (" (1x)" if is_train else ""))


def ratio_by_length_panel(ax, plain, baseline, colors, title: str | None) -> None:
    base_runs = next(iter(_by_scheme(baseline).values()))  # the one windowed baseline
    off_scale = []
    for scheme, runs in _by_scheme(plain).items():
        lengths = sorted({L for r in runs for L in r.ppl})
        vals = [_paired_ratio(runs, base_runs, L) for L in lengths]
        keep = [(L, v) for L, v in zip(lengths, vals) if v]
        if not keep:
            continue
        xs = [L for L, _ in keep]
        mean = np.array([np.mean(v) for _, v in keep])
        std = np.array([np.std(v, ddof=1) if len(v) > 1 else 0.0 for _, v in keep])
        if mean.max() > RATIO_TOP:
            off_scale.append(scheme)
        ax.plot(xs, mean, marker="o", ms=3, color=colors[scheme], lw=1.5, label=scheme)
        ax.fill_between(xs, np.maximum(mean - std, 1e-9), mean + std, color=colors[scheme], alpha=0.2)
    mark_train_length(ax, plain)
    _ratio_axis(ax, off_scale, "evaluation length (tokens)",
                f"{title + ': ' if title else ''}ratio to {base_runs[0].scheme} (same seed)")


def _positionwise_curve(runs, length: int, min_tokens: int | None = None):
    """(positions, mean per-position perplexity over seeds) of runs that have this length; with
    min_tokens, each point averages at least that many scored tokens (windows x positions)."""
    curves = [r.positionwise[length] for r in runs if length in r.positionwise]
    if not curves:
        return None
    size = curves[0][0]
    n = min(len(c[1]) for c in curves)
    loss = np.mean([c[1][:n] for c in curves], axis=0)
    x = np.arange(n) * size + size / 2
    windows = windows_at(runs, length)
    if min_tokens and windows:
        return _log_binned(x, loss, min_width=math.ceil(min_tokens / (windows * size)))
    return _log_binned(x, loss)


def windows_at(runs, length: int) -> int | None:
    """The windows scored at `length` summed over the runs (their curves are averaged), None when a run
    did not record its count."""
    counts = [r.windows.get(length) for r in runs if length in r.positionwise]
    return sum(counts) if counts and None not in counts else None


def _log_binned(x: np.ndarray, loss: np.ndarray, bins: int = 32, min_width: int = 1):
    """Average the loss over log-spaced position ranges: a few windows per length make a raw
    per-position curve mostly noise, and what matters (short vs long context) is logarithmic.
    min_width: each range holds at least that many of the stored bins (the last may take the rest)."""
    if len(x) <= bins and min_width <= 1:
        return x, np.exp(loss)
    edges = np.unique(np.geomspace(1, len(x), bins + 1).astype(int))
    if min_width > 1:
        edges = _at_least_apart(edges, min_width, len(x))
    starts, ends = np.concatenate([[0], edges[:-1]]), edges
    centers = np.array([x[a:b].mean() for a, b in zip(starts, ends) if b > a])
    means = np.array([loss[a:b].mean() for a, b in zip(starts, ends) if b > a])
    return centers, np.exp(means)


def _at_least_apart(edges: np.ndarray, min_width: int, n: int) -> np.ndarray:
    """Bin ends from `edges` (increasing, the last = n) such that every bin is at least min_width wide;
    a short remainder joins the last bin."""
    out, start = [], 0
    for e in edges:
        if e - start >= min_width:
            out.append(int(e))
            start = e
    if not out:
        return np.array([n])
    out[-1] = n
    return np.array(out)


def plot_positionwise(records, path: str, windowed=None, length: int | None = None, title: str | None = None,
                      min_tokens: int | None = None) -> str:
    """Fig. 5 at `length` (default: the longest length every scheme has a curve for); min_tokens: see
    positionwise_figure."""
    return save_figure(positionwise_figure(records, length, windowed, title, min_tokens), path)


def positionwise_figure(records, length: int | None = None, windowed=None, title: str | None = None,
                        min_tokens: int | None = None):
    """With min_tokens (e.g. MIN_TOKENS_PER_POINT; one run has a few windows at its longest length):
    each point averages at least that many scored tokens, and the legend and title say how many
    windows each curve is the mean of."""
    if length is None:
        curves = [set(r.positionwise) for r in records if r.positionwise]
        common = set.intersection(*curves) if curves else set()
        if not common:
            raise ValueError("plot_positionwise: the records share no length with a position-wise curve; pass length=")
        length = max(common)
    records, in_records = _split_baseline(records)  # a windowed run among `records` is a baseline too
    windowed = [*(windowed or []), *in_records]
    base_curve = next((c for c in (_positionwise_curve(runs, length, min_tokens) for runs in _by_scheme(windowed).values())
                       if c is not None), None)
    fig, axes = plt.subplots(1, 2 if base_curve else 1, figsize=(12.0 if base_curve else 6.4, 4.2), squeeze=False)
    ax = axes[0][0]
    colors = scheme_colors(records)
    curves = {}
    def counted(label: str, runs) -> str:
        windows = windows_at(runs, length) if min_tokens else None
        return f"{label}, mean of {windows} windows" if windows else label

    for scheme, runs in _by_scheme(records).items():
        curve = curves[scheme] = _positionwise_curve(runs, length, min_tokens)
        if curve is not None:
            ax.plot(*curve, lw=1, label=counted(scheme, runs), color=colors[scheme])
    for scheme, runs in _by_scheme(windowed).items():
        curve = _positionwise_curve(runs, length, min_tokens)
        if curve is not None:
            ax.plot(*curve, **BASELINE_LINE, label=counted(f"{scheme} (baseline)", runs))
    mark_train_length(ax, [*records, *windowed])
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(PLAIN)
    readable_log_y(ax)
    ax.set_xlabel("position in the window (log-spaced bins)")
    ax.set_ylabel("perplexity exp(loss)")
    smoothing = f"\neach point averages at least {min_tokens} scored tokens" if min_tokens else ""
    few = min((windows_at(runs, length) or FEW_WINDOWS for runs in _by_scheme(records).values()), default=FEW_WINDOWS)
    if min_tokens and few < FEW_WINDOWS:
        smoothing += f"\n{few} windows: the points differ by the text they cover too"
    ax.set_title(f"{title + ': ' if title else ''}position-wise perplexity at length {length}{smoothing}", fontsize=9)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    if base_curve is not None:
        rx = axes[0][1]
        off_scale = []
        for scheme, curve in curves.items():
            if curve is not None and len(curve[1]) == len(base_curve[1]):
                ratio = curve[1] / base_curve[1]  # mean over seeds of each, per log-spaced bin
                off_scale += [scheme] if ratio.max() > RATIO_TOP else []
                rx.plot(curve[0], ratio, lw=1, label=scheme, color=colors[scheme])
        mark_train_length(rx, records)
        _ratio_axis(rx, off_scale, "position in the window (log-spaced bins)",
                    f"{title + ': ' if title else ''}ratio to the windowed baseline at length {length}")
    return fig


def panel_grid(n: int, max_cols: int, panel_size: tuple[float, float]):
    """(figure, the first n axes) of a grid of n panels, max_cols wide; the unused cells are blank."""
    cols = min(max_cols, n)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(panel_size[0] * cols, panel_size[1] * rows), squeeze=False)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    return fig, list(axes.flat)[:n]


def plot_kernels(kernels: dict, path: str, train_length: int | None = None, title: str | None = None,
                 panel_size: tuple[float, float] = (4.2, 3.2), fontsize: int | None = None) -> str:
    """kernels: {label: array [heads, max_d + 1]} of f_h(d); one subplot per label, one line per head,
    distance on a log axis (d >= 1; f(0) is the bias at the query itself); train_length, when given,
    is marked (distances beyond it were never seen in training); title (the domain, or the run) heads
    each panel. panel_size (inches) and fontsize (every label, tick and legend; default: small, for a
    report's grid of panels): one run's figure uses KERNEL_PANEL_SINGLE and KERNEL_FONT_SINGLE."""
    if not kernels:
        raise ValueError("plot_kernels: no kernels to plot (every checkpoint lacked a score bias)")
    fig, axes = panel_grid(len(kernels), 3, panel_size)
    label_size = {} if fontsize is None else {"fontsize": fontsize}
    for ax, (label, f) in zip(axes, kernels.items()):
        f = np.asarray(f)
        d = np.arange(f.shape[1])
        for h in range(f.shape[0]):
            ax.plot(d[1:], f[h, 1:], lw=1, label=f"head {h}")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(PLAIN)
        if train_length:
            ax.axvline(train_length, **TRAIN_LINE, label=f"train length {train_length}")
        if np.abs(f).max() > KERNEL_SYMLOG_ABOVE:  # a near-quadratic power head would flatten the others
            ax.set_yscale("symlog", linthresh=1.0)
            ax.set_ylim(top=max(float(f.max()), 0.0) + 1.0)  # no empty positive decades above a decaying kernel
            ax.set_ylabel("f_h(d) (symlog)", **label_size)
        else:
            ax.set_ylabel("f_h(d)", **label_size)
        ax.set_title(f"{title}: {label}" if title else label, fontsize=fontsize or 8)
        ax.set_xlabel("distance d = i - j (log scale)", **label_size)
        if fontsize:
            ax.tick_params(labelsize=fontsize - 1)
        ax.grid(True, alpha=0.3)
        if f.shape[0] <= 12:
            ax.legend(fontsize=fontsize - 2 if fontsize else 6, ncol=2)
    return save_figure(fig, path)


def plot_retrieval_heatmap(section: dict, path: str, title: str, scoring: str = "choice") -> str:
    """Needle-in-a-haystack picture: accuracy per depth (rows, 0% = the needle first) x length
    (columns), one retrieval task's eval.json section; each cell printed, chance in the colour bar."""
    lengths, depths = section["lengths"], section["depths"]
    grid = np.full((len(depths), len(lengths)), np.nan)
    for c in section["cells"]:
        acc = c[scoring]["accuracy"]
        grid[depths.index(c["depth"]), lengths.index(c["length"])] = np.nan if acc is None else acc
    fig, ax = plt.subplots(figsize=(1.1 * len(lengths) + 2.6, 0.55 * len(depths) + 1.8))
    image = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="RdYlGn", aspect="auto")
    for (i, j), v in np.ndenumerate(grid):
        if not np.isnan(v):
            ax.text(j, i, f"{100 * v:.0f}", ha="center", va="center", fontsize=9)
    ax.set_xticks(range(len(lengths)), [str(L) for L in lengths])
    ax.set_yticks(range(len(depths)), [f"{d:g}%" for d in depths])
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("needle depth")
    what = "multiple choice" if scoring == "choice" else "greedy exact match"
    ax.set_title(f"{title}\n{what}, {section['cells'][0][scoring]['n']} prompts per cell", fontsize=10)
    bar = fig.colorbar(image, ax=ax)
    bar.set_label(f"accuracy (chance {section['chance']:.2f})" if scoring == "choice" else "accuracy")
    return save_figure(fig, path)
