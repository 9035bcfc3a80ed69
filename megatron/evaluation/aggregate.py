"""Many eval.json files (schemes x seeds x datasets) -> the paper's Table 3 and Table 4 layouts + plots.

    write_report(load_results(["runs/**/eval.json"]), "docs/results")
    # -> table3.md, table3.csv, speed.md, ppl_vs_length_<dataset>.png, positionwise_<dataset>.png

Table 3: rows = schemes (reference first), column groups = datasets x lengths, cells
"mean ± std" over seeds, † / ‡ per megatron.evaluation.stats (the reference is significantly better / worse).
Table 4: training sec/step per scheme and dataset, mean over seeds.
"""
from __future__ import annotations

import csv
import json
import math
import os
import re
from collections import defaultdict

from megatron.atomic_io import atomic_output
from megatron.evaluation.results import RunResult
from megatron.evaluation.stats import DAGGER, DOUBLE_DAGGER, FOOTNOTE, format_mean_std, mean_std, paired_test
from megatron.evaluation.windows import windows_line

MISSING = "–"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "dataset"


def order_schemes(schemes, reference: str) -> list[str]:
    """Reference first, then the rest alphabetically (a stable, documented row order)."""
    schemes = set(schemes)
    return ([reference] if reference in schemes else []) + sorted(schemes - {reference})


def table3_cells(runs: list[RunResult], reference: str = "kerple_log", alpha: float = 0.05) -> list[dict]:
    """One dict per (dataset, length, scheme): n, mean, std, p, dagger, better (than the reference), mark, seeds,
    note."""
    by = defaultdict(dict)  # (dataset, length, scheme) -> {seed: ppl}
    for r in runs:
        for length, ppl in r.ppl.items():
            by[(r.dataset, length, r.scheme)][r.seed] = ppl
    cells = []
    for (dataset, length, scheme), seeds in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        mean, std = mean_std(seeds.values())
        cell = {"dataset": dataset, "length": length, "scheme": scheme, "n": len(seeds), "mean": mean, "std": std,
                "p": math.nan, "dagger": False, "better": False, "mark": "", "seeds": sorted(seeds, key=str), "note": ""}
        ref = by.get((dataset, length, reference))
        if scheme == reference:
            cell["note"] = "reference"
        elif ref is None:
            cell["note"] = f"no test: reference {reference} has no result here"
        else:
            test = paired_test(ref, seeds, alpha)
            cell.update(p=test.p, dagger=test.reference_better, better=test.other_better, mark=test.mark,
                        note=test.note)
        cells.append(cell)
    return cells


def table3_markdown(cells: list[dict], reference: str, alpha: float = 0.05, digits: int = 2) -> str:
    columns = sorted({(c["dataset"], c["length"]) for c in cells})
    index = {(c["dataset"], c["length"], c["scheme"]): c for c in cells}
    schemes = order_schemes({c["scheme"] for c in cells}, reference)
    head = "| scheme | " + " | ".join(f"{d} {L}" for d, L in columns) + " |"
    lines = [head, "|---|" + "---:|" * len(columns)]
    for s in schemes:
        row = []
        for d, L in columns:
            c = index.get((d, L, s))
            row.append(MISSING if c is None else format_mean_std(c["mean"], c["std"], digits) + c["mark"])
        lines.append(f"| {s} | " + " | ".join(row) + " |")
    notes = [FOOTNOTE.format(dagger=DAGGER, double_dagger=DOUBLE_DAGGER, ref=reference, alpha=alpha)]
    untested = sorted({c["note"] for c in cells if c["note"].startswith("no test")})
    notes += [f"Untested cells: {n}." for n in untested]
    if reference not in schemes:
        notes.append(f"The reference scheme `{reference}` is not among the results, so no cell is marked.")
    return "\n".join(lines) + "\n\n" + "\n".join(notes) + "\n"


def windows_note(runs: list[RunResult]) -> str:
    """Which windows the cells scored (order and data seeds), and every length that got fewer than asked."""
    lines = []
    for order in sorted({r.window_order or "contiguous" for r in runs}):
        seeds = sorted({r.data_seed for r in runs if (r.window_order or "contiguous") == order}, key=str)
        lines.append(windows_line(order, ", ".join(map(str, seeds))))
    short = sorted(((r.dataset, L, r.scheme, str(r.seed), n, asked) for r in runs for L, (n, asked) in r.short.items()))
    lines += [f"Fewer windows than asked: {d} {L} {s} seed {seed}: {n} of {asked}." for d, L, s, seed, n, asked in short]
    return "\n" + "\n".join(lines) + "\n"


def write_table3_csv(cells: list[dict], path: str) -> None:
    with atomic_output(path, fsync=False) as tmp, open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["dataset", "length", "scheme", "n_seeds", "mean_ppl", "std_ppl", "p_value", "dagger",
                    "better_than_reference", "seeds", "note"])
        for c in cells:
            w.writerow([c["dataset"], c["length"], c["scheme"], c["n"], f"{c['mean']:.6f}", f"{c['std']:.6f}",
                        f"{c['p']:.6g}", int(c["dagger"]), int(c["better"]), " ".join(map(str, c["seeds"])), c["note"]])


def load_speed_file(path: str) -> dict:
    """--speed JSON: {run: sec_per_step}; run = "scheme/dataset/seed" or a path prefix of eval.json files."""
    try:
        with open(path) as f:
            data = json.load(f)
        return {str(k): float(v) for k, v in data.items()}
    except (OSError, ValueError, AttributeError, TypeError) as e:
        raise ValueError(f"--speed {path}: expected a JSON object mapping run -> sec/step ({e})") from e


def apply_speed(runs: list[RunResult], speed: dict) -> None:
    """Fill sec_per_step from the --speed mapping (it overrides the JSON's train_speed)."""
    for r in runs:
        for key, value in speed.items():
            prefix = os.path.abspath(key) + os.sep
            if key == f"{r.scheme}/{r.dataset}/{r.seed}" or os.path.abspath(r.path).startswith(prefix):
                r.sec_per_step = value


def speed_markdown(runs: list[RunResult], reference: str) -> str:
    rows = defaultdict(list)
    for r in runs:
        if r.sec_per_step is not None:
            rows[(r.scheme, r.dataset)].append(r.sec_per_step)
    title = "# Training speed (sec/step; paper Table 4 layout)\n\n"
    if not rows:
        return title + ("No speed data: none of the result files has a `train_speed` {\"sec_per_step\": x} key and "
                        "no --speed JSON mapped runs to sec/step.\n")
    datasets = sorted({d for _, d in rows})
    lines = ["| scheme | " + " | ".join(datasets) + " |", "|---|" + "---:|" * len(datasets)]
    for s in order_schemes({s for s, _ in rows}, reference):
        cells = [format_mean_std(*mean_std(rows[(s, d)]), digits=3) if (s, d) in rows else MISSING for d in datasets]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return title + "\n".join(lines) + "\n\nMean ± sample std over seeds of seconds per training step.\n"


def write_report(runs: list[RunResult], out_dir: str, reference: str = "kerple_log", alpha: float = 0.05,
                 digits: int = 2, log=print) -> dict[str, str]:
    """Write every table and plot for these runs into out_dir; returns {name: path}."""
    from megatron.evaluation import plots  # matplotlib only when plotting

    os.makedirs(out_dir, exist_ok=True)
    cells = table3_cells(runs, reference, alpha)
    paths = {"table3.md": os.path.join(out_dir, "table3.md"), "table3.csv": os.path.join(out_dir, "table3.csv"),
             "speed.md": os.path.join(out_dir, "speed.md")}
    with atomic_output(paths["table3.md"], fsync=False) as tmp, open(tmp, "w") as f:
        f.write("# Perplexity by scheme, dataset and length (paper Table 3 layout)\n")
        for dataset in sorted({c["dataset"] for c in cells}):  # one table per domain: 6+ lengths each
            f.write(f"\n## {dataset}\n\n")
            f.write(table3_markdown([c for c in cells if c["dataset"] == dataset], reference, alpha, digits))
        f.write(windows_note(runs))
    write_table3_csv(cells, paths["table3.csv"])
    with atomic_output(paths["speed.md"], fsync=False) as tmp, open(tmp, "w") as f:
        f.write(speed_markdown(runs, reference))
    for dataset in sorted({r.dataset for r in runs}):
        subset = [r for r in runs if r.dataset == dataset]
        name = f"ppl_vs_length_{_safe(dataset)}.png"
        paths[name] = plots.plot_ppl_vs_length(subset, os.path.join(out_dir, name), title=dataset)
        name = f"positionwise_{_safe(dataset)}.png"
        plain = [r for r in subset if r.window is None]
        windowed = [r for r in subset if r.window is not None] or None
        if not any(r.positionwise for r in plain):
            log(f"no position-wise plot for {dataset}: no result without a window has a position-wise curve")
        else:
            paths[name] = plots.plot_positionwise(plain, os.path.join(out_dir, name), windowed=windowed, title=dataset)
    for p in paths.values():
        log(f"wrote {p}")
    return paths
