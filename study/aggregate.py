"""Many eval.json files (schemes x seeds x datasets) -> the paper's Table 3 and Table 4 layouts + plots.

    write_report(load_results(["runs/**/eval.json"]), "docs/results")
    # -> table3.md, table3.csv, speed.md, ppl_vs_length_<group>.png, positionwise_<group>.png

A group is one dataset at one train length (`<dataset>_L<train length>` in file names): runs of
different train lengths are never in one test. Table 3: one table per group, rows = schemes
(reference first), columns = lengths, cells "mean ± std" over seeds, † / ‡ per
megatron.evaluation.stats (the reference is significantly better / worse after the Holm-Bonferroni
correction over the row's family: one scheme against the reference at every length of one dataset
and train length, the claim a row supports; each cell keeps its raw p, adjusted p and exact
sign-flip p). Where a scheme is tested
on fewer seeds than the reference has, a row gives the reference's mean over just those paired
seeds, next to the test. Table 4: training sec/step per scheme and group, mean over seeds.
Fig. 5 (positionwise) is drawn at 8x the train length, the paper's 4096 = 8 x 512.
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
from megatron.evaluation.stats import (
    DAGGER,
    DOUBLE_DAGGER,
    FOOTNOTE,
    correct_family,
    format_mean_std,
    mean_std,
    paired_test,
)
from megatron.evaluation.windows import windows_line
from study.results import load_results

MISSING = "–"
FIG5_FACTOR = 8  # the paper's Fig. 5: length 4096 at train length 512


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "dataset"


def group_title(dataset: str, train_length: int | None) -> str:
    return f"{dataset}, train length {train_length}" if train_length else dataset


def group_slug(dataset: str, train_length: int | None) -> str:
    return f"{_safe(dataset)}_L{train_length}" if train_length else _safe(dataset)


def _group_sort(key: tuple) -> tuple:
    return key[0], key[1] or 0


def groups_of(runs: list[RunResult]) -> dict[tuple, list[RunResult]]:
    """{(dataset, train length): runs}, sorted by dataset then train length."""
    out = defaultdict(list)
    for r in runs:
        out[(r.dataset, r.train_length)].append(r)
    return dict(sorted(out.items(), key=lambda kv: _group_sort(kv[0])))


def order_schemes(schemes, reference: str) -> list[str]:
    """Reference first, then the rest alphabetically (a stable, documented row order)."""
    schemes = set(schemes)
    return ([reference] if reference in schemes else []) + sorted(schemes - {reference})


def table3_cells(runs: list[RunResult], reference: str = "kerple_log", alpha: float = 0.05) -> list[dict]:
    """One dict per (dataset, train length, length, scheme): n, mean, std, p (raw), p_holm (adjusted over
    the row's family: the scheme's tests at every length of its group), p_exact (sign flips), family
    (its size), dagger, better (than the reference), mark (both by p_holm), seeds, note, and
    reference_paired_mean / paired_seeds when the test paired fewer seeds than the reference has (its
    mean over those seeds; nan otherwise)."""
    by = defaultdict(dict)  # (dataset, train length, length, scheme) -> {seed: ppl}
    for r in runs:
        for length, ppl in r.ppl.items():
            by[(r.dataset, r.train_length, length, r.scheme)][r.seed] = ppl
    cells = []
    for (dataset, train, length, scheme), seeds in sorted(by.items(), key=lambda kv: (*_group_sort(kv[0]), *kv[0][2:])):
        mean, std = mean_std(seeds.values())
        cell = {"dataset": dataset, "train_length": train, "length": length, "scheme": scheme, "n": len(seeds),
                "mean": mean, "std": std, "p": math.nan, "p_holm": math.nan, "p_exact": math.nan, "family": 0,
                "dagger": False, "better": False, "mark": "",
                "seeds": sorted(seeds, key=str), "note": "", "reference_paired_mean": math.nan, "paired_seeds": []}
        ref = by.get((dataset, train, length, reference))
        if scheme == reference:
            cell["note"] = "reference"
        elif ref is None:
            cell["note"] = f"no test: reference {reference} has no result here"
        else:
            test = paired_test(ref, seeds, alpha)
            cell.update(test=test, p=test.p, p_exact=test.exact_p, note=test.note)
            paired = sorted(set(ref) & set(seeds), key=str)
            if paired and len(paired) < len(ref):
                cell.update(reference_paired_mean=float(sum(ref[s] for s in paired) / len(paired)),
                            paired_seeds=paired)
        cells.append(cell)
    families = defaultdict(list)  # one scheme against the reference at every length of one table: one family
    for c in cells:
        if "test" in c:
            families[(c["dataset"], c["train_length"], c["scheme"])].append(c)
    for family in families.values():
        tested = [c for c in family if not math.isnan(c["test"].p)]
        for c, test in zip(tested, correct_family([c["test"] for c in tested], alpha)):
            c.update(p_holm=test.p_adjusted, family=len(tested), dagger=test.reference_better,
                     better=test.other_better, mark=test.mark)
        for c in family:
            del c["test"]
    return cells


def _seeds_text(seeds) -> str:
    return ", ".join(map(str, seeds))


def table3_markdown(cells: list[dict], reference: str, alpha: float = 0.05, digits: int = 2) -> str:
    """The table of one group (one dataset at one train length)."""
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
        if s == reference:  # its mean over each smaller seed set a test paired it on, next to the tests
            for paired in sorted({tuple(c["paired_seeds"]) for c in cells if c["paired_seeds"]}, key=str):
                means = {(c["dataset"], c["length"]): c["reference_paired_mean"] for c in cells
                         if tuple(c["paired_seeds"]) == paired}
                row = [MISSING if k not in means else f"{means[k]:.{digits}f}" for k in columns]
                lines.append(f"| {reference}, mean of seeds {_seeds_text(paired)} | " + " | ".join(row) + " |")
    sizes = sorted({c["family"] for c in cells if c["family"]})
    notes = [FOOTNOTE.format(dagger=DAGGER, double_dagger=DOUBLE_DAGGER, ref=reference, alpha=alpha,
                             m=" / ".join(map(str, sizes)) or "0")]
    if any(c["paired_seeds"] for c in cells):
        notes.append(f"A row `{reference}, mean of seeds ...` is the reference's mean over only the seeds that "
                     f"the schemes with fewer seeds were paired with in their tests.")
    untested = sorted({c["note"] for c in cells if c["note"].startswith("no test")})
    notes += [f"Untested cells: {n}." for n in untested]
    if reference not in schemes:
        notes.append(f"The reference scheme `{reference}` is not among the results, so no cell is marked.")
    return "\n".join(lines) + "\n\n" + "\n".join(notes) + "\n"


def windows_per_length(runs: list[RunResult]) -> str:
    """"Windows scored per length: 64: 2048, ..., 2048: 64" (a range where runs differ), from the
    result files' per-length counts."""
    counts = defaultdict(set)
    for r in runs:
        for length, n in r.windows.items():
            counts[length].add(n)
    if not counts:
        return ""
    parts = [f"{L}: {min(v)}" if len(v) == 1 else f"{L}: {min(v)}-{max(v)}" for L, v in sorted(counts.items())]
    return "Windows scored per length: " + ", ".join(parts) + "."


def provenance(runs: list[RunResult]) -> str:
    """"Checkpoints at step 500; evaluated on cuda:0 (NVIDIA H100 80GB HBM3)." for one group: how long
    its runs trained (a short schedule shows here) and where they were scored, where recorded."""
    steps = sorted({r.iteration for r in runs if r.iteration is not None})
    devices = sorted({r.device_name for r in runs if r.device_name})
    parts = []
    if steps:
        parts.append("Checkpoints at step " + ", ".join(f"{s:,}" for s in steps))
    if devices:
        parts.append("evaluated on " + "; ".join(devices))
    return "; ".join(parts) + "." if parts else ""


def windows_note(runs: list[RunResult]) -> str:
    """Which windows the cells scored (order and data seeds), and every length that got fewer than asked."""
    lines = []
    for order in sorted({r.window_order or "contiguous" for r in runs}):
        seeds = sorted({r.data_seed for r in runs if (r.window_order or "contiguous") == order}, key=str)
        lines.append(windows_line(order, ", ".join(map(str, seeds))))
    short, having = defaultdict(list), defaultdict(int)  # (group, length, scored, asked) -> runs; (group, length) -> n
    for r in runs:
        group = group_title(r.dataset, r.train_length)
        for L in r.ppl:
            having[(group, L)] += 1
        for L, (n, asked) in r.short.items():
            short[(group, L, n, asked)].append(f"{r.scheme} seed {r.seed}")
    for (group, L, n, asked), which in sorted(short.items(), key=lambda kv: tuple(map(str, kv[0]))):
        who = f"all {len(which)} results" if len(which) == having[(group, L)] else "; ".join(sorted(which))
        lines.append(f"Fewer windows than asked: {group}, length {L}: {n} of {asked} ({who}).")
    return "\n" + "\n".join(lines) + "\n"


def write_table3_csv(cells: list[dict], path: str) -> None:
    with atomic_output(path, fsync=False) as tmp, open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["dataset", "train_length", "length", "scheme", "n_seeds", "mean_ppl", "std_ppl", "p_value",
                    "p_holm", "family_tests", "p_exact_sign_flip", "dagger", "better_than_reference", "seeds",
                    "reference_mean_paired_seeds", "paired_seeds", "note"])
        for c in cells:
            w.writerow([c["dataset"], c["train_length"], c["length"], c["scheme"], c["n"], f"{c['mean']:.6f}",
                        f"{c['std']:.6f}", f"{c['p']:.6g}", f"{c['p_holm']:.6g}", c["family"],
                        f"{c['p_exact']:.6g}", int(c["dagger"]), int(c["better"]),
                        " ".join(map(str, c["seeds"])), f"{c['reference_paired_mean']:.6f}",
                        " ".join(map(str, c["paired_seeds"])), c["note"]])


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
            rows[(r.scheme, group_title(r.dataset, r.train_length))].append(r.sec_per_step)
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
    from megatron.evaluation import plots  # lazy: matplotlib, only when plotting

    os.makedirs(out_dir, exist_ok=True)
    cells = table3_cells(runs, reference, alpha)
    paths = {"table3.md": os.path.join(out_dir, "table3.md"), "table3.csv": os.path.join(out_dir, "table3.csv"),
             "speed.md": os.path.join(out_dir, "speed.md")}
    groups = groups_of(runs)
    with atomic_output(paths["table3.md"], fsync=False) as tmp, open(tmp, "w") as f:
        f.write("# Perplexity by scheme, dataset and length (paper Table 3 layout)\n")
        for (dataset, train), subset in groups.items():  # one table per domain and train length
            f.write(f"\n## {group_title(dataset, train)}\n\n")
            f.write(table3_markdown([c for c in cells if (c["dataset"], c["train_length"]) == (dataset, train)],
                                    reference, alpha, digits))
            f.write("\n" + windows_per_length(subset) + "\n")
            if provenance(subset):
                f.write(provenance(subset) + "\n")
        f.write(windows_note(runs))
    write_table3_csv(cells, paths["table3.csv"])
    with atomic_output(paths["speed.md"], fsync=False) as tmp, open(tmp, "w") as f:
        f.write(speed_markdown(runs, reference))
    for (dataset, train), subset in groups.items():
        title, slug = group_title(dataset, train), group_slug(dataset, train)
        name = f"ppl_vs_length_{slug}.png"
        paths[name] = plots.plot_ppl_vs_length(subset, os.path.join(out_dir, name), title=title)
        name = f"positionwise_{slug}.png"
        plain = [r for r in subset if r.window is None]
        windowed = [r for r in subset if r.window is not None] or None
        fig5 = FIG5_FACTOR * train if train and all(FIG5_FACTOR * train in r.positionwise for r in plain) else None
        if not any(r.positionwise for r in plain):
            log(f"no position-wise plot for {title}: no result without a window has a position-wise curve")
        else:
            paths[name] = plots.plot_positionwise(plain, os.path.join(out_dir, name), windowed=windowed, title=title,
                                                  length=fig5)
    for p in paths.values():
        log(f"wrote {p}")
    return paths


def add_common_args(p) -> None:
    """The flags tools/aggregate_results.py and tools/make_report.py share."""
    p.add_argument("--out", required=True, help="output directory for tables and plots")
    p.add_argument("--reference", default="kerple_log", help="scheme the t-test compares every other scheme with")
    p.add_argument("--alpha", type=float, default=0.05, help="significance level of the paired t-test")
    p.add_argument("--meta-from-path", default=None, metavar="REGEX",
                   help="regex with named groups scheme/dataset/seed, applied to each file's path for keys its JSON lacks")
    p.add_argument("--speed", default=None, metavar="JSON",
                   help='JSON mapping run -> sec/step; run is "scheme/dataset/seed" or a directory holding eval.json')
    p.add_argument("--digits", type=int, default=2, help="decimals in the table cells")


def build_report(results, args, log=print) -> dict:
    """Table 3/4 and the plots of `results` (eval.json files, directories, globs) into args.out."""
    runs = load_results(results, args.meta_from_path)
    if args.speed:
        apply_speed(runs, load_speed_file(args.speed))
    log(f"{len(runs)} result files: {len({r.scheme for r in runs})} schemes, "
        f"{len({r.dataset for r in runs})} datasets, {len({r.seed for r in runs})} seeds")
    return write_report(runs, args.out, args.reference, args.alpha, args.digits, log)
