"""The one command that regenerates every table and plot from result files (+ kernels from checkpoints).

    python tools/make_report.py --results 'runs/**/eval.json' --checkpoints 'runs/*/checkpoints' --out docs/results
    python tools/make_report.py --records docs/results/runs --out docs/results   # run records (run_matrix.py --records)

= tools/aggregate_results.py (table3.md/.csv, speed.md, perplexity and position-wise plots) plus
kernels.png: the learned f_h(d) per head for d up to the longest evaluated length (one subplot
per score-bias scheme; the first checkpoint of each scheme in sorted path order; a scheme whose
bias depends on the query position too, FIRE, one subplot per query position). Checkpoints
of schemes without a score bias (rotary, ...) are skipped with a message.

With --records DIR (what tools/run_matrix.py --records writes, checkpoints not needed): the
results are DIR's evaluations, kernels_<group>.png comes from the records' kernels (lowest seed
of each scheme; a group is a dataset at one train length), and from the records also:
drift.md (each head's relative change of its positional parameters over the last 20% of
training) and trajectories_<group>.png (the lowest seed of each scheme and every run with a head
over the drift target, that head drawn thick); flat_kernels.md (every KERPLE head's f(L), f(8L),
f(32L)); train_test.md (final training vs 1x test perplexity); trend.md and
trend_<dataset>.png (the windowed-minus-full and power-minus-log gaps against the train length, and
each train length's perplexity on the same windows: study/train_length_quality.py);
gap_vs_quality_<corpus>.png and its trend.md section (every gap against model quality and the train
length together, a config two designs share counted once: study/gap_vs_quality.py and
replicates.py, which read the records' configs relative to this checkout); growth.md (each scheme's gap to the
reference at 1x and how much it changes out to 8x and 32x: study/growth.py); and the report
itself: README.md and claims.md rendered from --templates (README.template.md: every figure of the
prose a {{name}} filled from study/claims.py) and, with --status-page, docs/status.md's generated
study paragraph (summary.template.md, between its study:summary markers).
"""
from __future__ import annotations

import argparse
import glob
import json
import os

from megatron.atomic_io import atomic_output
from megatron.cli_args import ArgumentParser
from study.aggregate import _safe, add_common_args, build_report, group_slug, group_title, table3_cells
from study.flat_kernels import flat_markdown, head_values
from study.gap_vs_quality import gap_quality_markdown, gap_quality_points
from study.growth import growth_markdown, growth_rows
from study.replicates import identities
from study.results import load_results
from study.train_length_quality import quality_markdown, quality_points
from study.train_test import pairs, train_test_markdown
from study.trend import gap_points, has_points, planned_runs, trend_markdown

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUDY_RECORDS = os.path.join(REPO, "docs", "results", "runs")


def kernel_plot(patterns, max_distance: int, out_dir: str, log=print) -> str | None:
    # lazy: torch (the kernels) and matplotlib, only for the plots; --help needs none
    from megatron.evaluation.kernels import learned_kernels
    from megatron.evaluation.plots import plot_kernels

    dirs = sorted({d for pat in patterns for d in glob.glob(pat, recursive=True) if os.path.isdir(d)})
    if not dirs:
        raise ValueError(f"--checkpoints {patterns} matched no directory; quote the glob, e.g. 'runs/*/checkpoints'")
    kernels = {}
    for d in dirs:
        out = learned_kernels(d, max_distance)
        if out is None:
            log(f"skipping {d}: its positional scheme has no score bias, so no kernel f_h(d)")
        elif out["scheme"] not in kernels:
            kernels[out["scheme"]] = (d, out)
    if not kernels:
        log("no kernel plot: no checkpoint has a score-bias scheme")
        return None
    panels = {}
    for s, (d, out) in kernels.items():
        label = f"{s} ({os.path.relpath(d)})"
        # A query-dependent bias (FIRE) gets one panel per query position i, d = 0..i.
        for i, k in out.get("by_query", {out["distance"][-1]: out["kernel"]}).items():
            panels[label if "by_query" not in out else f"{label}, query i = {i}"] = k
    path = plot_kernels(panels, os.path.join(out_dir, "kernels.png"))
    log(f"wrote {path}")
    return path


def records_report(records_dir: str, out_dir: str, log=print) -> None:
    """Kernel plots, drift table and trajectory plots (per dataset and train length), the flat-kernel
    assessment, the train/test check and the train-length trend, from run records."""
    # lazy: matplotlib (the plots) and torch (the records' kernels); --help needs none
    from megatron.evaluation.plots import plot_kernels
    from study.convergence import (
        drift_markdown,
        drift_rows,
        head_series,
        load_records,
        over_target,
        records_to_draw,
    )
    from study.plots import plot_trajectories

    records = load_records(records_dir)
    if not records:
        raise ValueError(f"--records {records_dir}: no complete run record (record.json) in it; "
                         "write them with tools/run_matrix.py --records")
    first = {}  # (dataset, train length, scheme) -> the record with the lowest seed
    for rec in sorted(records, key=lambda r: str(r["seed"])):
        first.setdefault((rec["dataset"], rec["train_length"] or 0, rec["label"]), rec)
    for dataset, train in sorted({(d, L) for d, L, _ in first}):
        kernels, trajectories, over = {}, {}, {}
        chosen = [(scheme, rec) for (d, L, scheme), rec in sorted(first.items()) if (d, L) == (dataset, train)]
        for scheme, rec in chosen:
            path = os.path.join(rec["dir"], "kernel.json")
            if os.path.isfile(path):
                with open(path) as f:
                    k = json.load(f)
                label = f"{scheme} (seed {rec['seed']})"
                for i, kern in (k.get("by_query") or {str(k["max_distance"]): k["kernel"]}).items():
                    kernels[label if "by_query" not in k else f"{label}, query i = {i}"] = kern
        group = [r for r in records if (r["dataset"], r["train_length"] or 0) == (dataset, train)]
        for rec in records_to_draw(group):
            scheme, moved = rec["label"], over_target(rec)
            for name, heads in head_series(rec["trajectory"]).items():
                label = f"{scheme} {name} (seed {rec['seed']})"
                trajectories[label] = (rec["trajectory"]["iteration"], heads)
                over[label] = moved.get(name, {})
        title, slug = group_title(dataset, train or None), group_slug(dataset, train or None)
        if kernels:
            path = plot_kernels(kernels, os.path.join(out_dir, f"kernels_{slug}.png"), train or None, title)
            log(f"wrote {path}")
        if trajectories:
            path = plot_trajectories(trajectories, os.path.join(out_dir, f"trajectories_{slug}.png"), title, over)
            log(f"wrote {path}")
    rows = drift_rows(records)
    path = os.path.join(out_dir, "drift.md")
    with atomic_output(path, fsync=False) as tmp, open(tmp, "w") as f:
        f.write("# Do the learned positional parameters still move? (last 20% of training)\n\n")
        f.write(drift_markdown(rows) if rows else "No record has per-head positional parameters.\n")
    log(f"wrote {path}")

    _write(os.path.join(out_dir, "flat_kernels.md"), "# Do KERPLE heads learn flat kernels? (the paper's §5.4)\n\n"
           + flat_markdown(head_values(records)), log)
    _write(os.path.join(out_dir, "train_test.md"), "# Final training perplexity vs test perplexity at 1x\n\n"
           + train_test_markdown(pairs(records)), log)


def _write(path: str, text: str, log) -> None:
    with atomic_output(path, fsync=False) as tmp, open(tmp, "w") as f:  # whole or not at all, as every output
        f.write(text)
    log(f"wrote {path}")


def trend_report(runs, args, log=print) -> None:
    """trend.md and trend_<dataset>.png from the evaluations (study/trend.py)."""
    # lazy: torch (the records) and matplotlib (the plots); --help needs neither
    from study.convergence import load_records
    from study.plots import plot_gap_vs_quality, plot_trend

    matrices = sorted({m for pat in args.planned for m in glob.glob(pat)})
    gaps = gap_points(runs, planned_runs(matrices))
    # a config two designs share (their records' configs, relative to this checkout) is one point of the fit
    quality_vs_gap = gap_quality_points(runs, identities(load_records(args.records), REPO))
    _write(os.path.join(args.out, "trend.md"), "# The gaps against the train length (issue 24)\n\n"
           + trend_markdown(gaps, table3_cells(runs, args.reference, args.alpha))
           + "\n## Is the model as good at every train length? (perplexity on the same windows)\n\n"
           + quality_markdown(quality_points(runs))
           + "\n## Does the gap follow the train length or the model's quality?\n\n"
           + gap_quality_markdown(quality_vs_gap), log)
    for name, res in quality_vs_gap.items():
        panels = {key: pts for key, pts in res["points"].items() if key[1] > 1}  # extrapolation only (trend.md has 1x)
        log(f"wrote {plot_gap_vs_quality(panels, os.path.join(args.out, f'gap_vs_quality_{_safe(name)}.png'), name)}")
    for d in sorted({d for d, _, _ in gaps if has_points(gaps, d)}):  # no empty plot for a planned-only dataset
        panels = {(gap, k): g["points"] for (dd, gap, k), g in gaps.items() if dd == d and k > 1}
        lengths = {L for (dd, _, _), g in gaps.items() if dd == d for L in g["missing"]}
        log(f"wrote {plot_trend(panels, os.path.join(args.out, f'trend_{_safe(d)}.png'), d, lengths)}")


def growth_report(runs, args, log=print) -> None:
    """growth.md: each scheme's gap to the reference at 1x and kx and the growth gap between them
    (study/growth.py)."""
    _write(os.path.join(args.out, "growth.md"), "# How much of each lead is extrapolation? The gap at 1x and its growth\n\n"
           + growth_markdown(growth_rows(runs, args.reference, args.alpha), args.reference, args.alpha), log)


def claims_report(runs, args, log=print) -> None:
    """README.md and claims.md from the templates; the status page's study paragraph with --status-page."""
    # lazy: torch (records); --help needs none
    from study.claims import report_texts, with_block
    from study.convergence import load_records

    texts = report_texts(runs, load_records(args.records), args.templates, REPO)
    for name in ("claims.md", "README.md"):
        _write(os.path.join(args.out, name), texts[name], log)
    if args.status_page:
        with open(args.status_page) as f:
            text = f.read()
        _write(args.status_page, with_block(text, texts["summary"], args.status_page), log)


def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", action="append", default=[], help="eval.json glob or directory (repeatable)")
    p.add_argument("--records", default=None, metavar="DIR",
                   help="run records written by tools/run_matrix.py --records (results, kernels, convergence)")
    p.add_argument("--checkpoints", action="append", default=[], help="checkpoint directory glob (repeatable)")
    p.add_argument("--planned", action="append", default=[], metavar="MATRIX_GLOB",
                   help="with --records: matrix.json files (globs) of the planned runs; trend.md names the "
                        "planned ones without a record (e.g. 'configs/repro_cpu_v3/*/matrix.json')")
    p.add_argument("--max-distance", type=int, default=None,
                   help="largest d of the kernel plot (default: the longest evaluated length)")
    p.add_argument("--templates", default=None, metavar="DIR",
                   help="with --records: render README.md and claims.md from DIR's README.template.md (and "
                        "summary.template.md for --status-page); the claims are this study's (study/"
                        "claims.py). Default: docs/results when --records is this repository's docs/results/runs, "
                        "else none")
    p.add_argument("--status-page", default=None, metavar="PAGE",
                   help="with --records: rewrite this page's study paragraph (between <!-- study:summary:begin --> "
                        "and <!-- study:summary:end -->) from summary.template.md, e.g. docs/status.md")
    add_common_args(p)
    args = p.parse_args(argv)
    if args.records:
        if not os.path.isdir(args.records):
            raise ValueError(f"--records {args.records} is not a directory; give the DIR of tools/run_matrix.py --records")
        # Only complete records (record.json is written last): a run being recorded right now is left out.
        args.results += sorted(f for f in glob.glob(os.path.join(glob.escape(args.records), "*", "eval*.json"))
                               if os.path.isfile(os.path.join(os.path.dirname(f), "record.json")))
        if not args.results:
            raise ValueError(f"--records {args.records}: no complete run record (record.json) in it; "
                             "write them with tools/run_matrix.py --records")
    if not args.results:
        raise ValueError("give --results (eval.json globs or directories) or --records (run records)")
    build_report(args.results, args)

    runs = load_results(args.results, args.meta_from_path) if args.records or args.checkpoints else []  # read once
    if args.records:
        records_report(args.records, args.out)
        trend_report(runs, args)
        growth_report(runs, args)
        if args.templates is None and os.path.realpath(args.records) == os.path.realpath(STUDY_RECORDS):
            args.templates = os.path.dirname(STUDY_RECORDS)  # the study's own records: its report too
        if args.templates:
            claims_report(runs, args)
        elif args.status_page:
            raise ValueError("--status-page needs --templates DIR (summary.template.md)")
    if args.checkpoints:
        longest = max(L for r in runs for L in r.ppl)
        kernel_plot(args.checkpoints, args.max_distance or longest, args.out)
    print(f"report written to {args.out}")
    return 0
