"""The study's own figures (the single-run figures and their axis helpers are megatron/evaluation/plots.py):

- plot_trajectories: each head's learned positional parameters against the training step; the
  heads that moved more than the drift target over the last 20% are drawn thick and named.
- plot_trend: the seed-paired gaps against the train length (trend.md).
- plot_gap_vs_quality: every gap against the kerple_log model's quality (gap_vs_quality.py).
"""
from __future__ import annotations

import numpy as np
from matplotlib.ticker import NullLocator

from megatron.evaluation.plots import PLAIN, ReadableLogLocator, panel_grid, plt, save_figure  # plt: Agg set there


def plot_trajectories(panels: dict, path: str, title: str | None = None, over: dict | None = None) -> str:
    """panels: {label: (iterations, {head: values})}: each head's learned positional parameter
    against the training step, one subplot per label (the convergence evidence of the report).
    over: {label: {head: relative change}} of the heads beyond the drift target: drawn thick, named."""
    if not panels:
        raise ValueError("plot_trajectories: no per-head trajectories to plot")
    fig, axes = panel_grid(len(panels), 4, (3.6, 2.7))
    for ax, (label, (steps, heads)) in zip(axes, panels.items()):
        moved = (over or {}).get(label, {})
        for h, values in sorted(heads.items()):
            if h in moved:
                ax.plot(steps, values, lw=2.5, label=f"head {h}: {moved[h]:.1%} in last 20%")
            else:
                ax.plot(steps, values, lw=1, label=f"head {h}")
        ax.axvspan(0.8 * steps[-1], steps[-1], color="0.9", lw=0)  # the tail the drift table measures
        ax.set_title(f"{title}: {label}" if title else label, fontsize=7)
        ax.set_xlabel("training step")
        ax.set_ylabel("value (clamped)")
        ax.grid(True, alpha=0.3)
        if len(heads) <= 12:
            ax.legend(fontsize=6, ncol=2)
    return save_figure(fig, path)


def plot_trend(gaps: dict, path: str, title: str, train_lengths=None) -> str:
    """gaps: {(gap name, factor): {L: {seed: gap %}}}: one panel per gap name (in the dict's order),
    the gap against the train length (log2 axis spanning train_lengths, the planned ones included),
    one line per factor (mean over seeds, ±1 std band, each seed a dot)."""
    names = list(dict.fromkeys(g for g, _ in gaps))
    if not names:
        raise ValueError("plot_trend: no gaps to plot")
    fig, axes = panel_grid(len(names), 3, (4.4, 3.4))
    palette = plt.get_cmap("tab10").colors
    factors = sorted({k for _, k in gaps})
    for ax, name in zip(axes, names):
        for i, k in enumerate(factors):
            points = gaps.get((name, k), {})
            if not points:
                continue
            Ls = sorted(points)
            vals = [np.array(list(points[L].values())) for L in Ls]
            mean = np.array([v.mean() for v in vals])
            std = np.array([v.std(ddof=1) if v.size > 1 else 0.0 for v in vals])
            color = palette[i % len(palette)]
            ax.plot(Ls, mean, marker="o", ms=3, color=color, label=f"at {k}x L")
            ax.fill_between(Ls, mean - std, mean + std, color=color, alpha=0.2)
            for L, v in zip(Ls, vals):
                ax.scatter([L] * v.size, v, s=8, color=color, alpha=0.6)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(PLAIN)
        ticks = sorted(set(train_lengths or ()) | {L for (g, _), pts in gaps.items() if g == name for L in pts})
        ax.set_xticks(ticks)
        ax.set_xlim(ticks[0] / 1.25, ticks[-1] * 1.25)
        _gap_panel(ax, "train length L", f"{title}: {name}", 7)
    return save_figure(fig, path)


def plot_gap_vs_quality(panels: dict, path: str, title: str) -> str:
    """panels: {(gap name, factor): [GapPoint]} (study/gap_vs_quality.py): one panel each,
    the gap against the kerple_log model's quality q (log x axis), one colour per train length and one
    marker per group, so a gap that follows q and not L lines up across the colours."""
    if not panels:
        raise ValueError("plot_gap_vs_quality: no points to plot")
    fig, axes = panel_grid(len(panels), 2, (4.6, 3.6))
    Ls = sorted({p.train_length for pts in panels.values() for p in pts})
    groups = sorted({p.dataset for pts in panels.values() for p in pts})
    palette, markers = plt.get_cmap("viridis"), "osD^vP*X"
    color = {L: palette(i / max(len(Ls) - 1, 1)) for i, L in enumerate(Ls)}
    for ax, ((name, k), pts) in zip(axes, panels.items()):
        for L in Ls:
            for j, d in enumerate(groups):
                sel = [p for p in pts if p.train_length == L and p.dataset == d]
                if sel:
                    ax.scatter([p.quality for p in sel], [p.gap for p in sel], s=22, color=color[L],
                               marker=markers[j % len(markers)], label=f"L = {L}, {d}", alpha=0.85)
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(ReadableLogLocator())
        ax.xaxis.set_major_formatter(PLAIN)
        ax.xaxis.set_minor_locator(NullLocator())
        _gap_panel(ax, "q: kerple_log's perplexity, first positions (lower: better)", f"{title}: {name} at {k}x L", 6)
    return save_figure(fig, path)


def _gap_panel(ax, xlabel: str, title: str, legend_size: int) -> None:
    """The trend and gap-against-quality panels' shared frame: a zero line, labels, grid and legend."""
    ax.axhline(0.0, color="0.3", lw=0.8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("gap, % of kerple_log's perplexity")
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=legend_size)
