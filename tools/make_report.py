"""The one command that regenerates every table and plot from result files (+ kernels from checkpoints).

    python tools/make_report.py --results 'runs/**/eval.json' --checkpoints 'runs/*/checkpoints' --out docs/results

= tools/aggregate_results.py (table3.md/.csv, speed.md, perplexity and position-wise plots) plus
kernels.png: the learned f_h(d) per head for d up to the longest evaluated length (one subplot
per score-bias scheme; the first checkpoint of each scheme in sorted path order; a scheme whose
bias depends on the query position too, FIRE, one subplot per query position). Checkpoints
of schemes without a score bias (rotary, ...) are skipped with a message.
"""
from __future__ import annotations

import argparse
import glob
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from aggregate_results import add_common_args, build_report  # noqa: E402

from megatron.errors import run_cli  # noqa: E402


def kernel_plot(patterns, max_distance: int, out_dir: str, log=print) -> str | None:
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", action="append", required=True, help="eval.json glob or directory (repeatable)")
    p.add_argument("--checkpoints", action="append", default=[], help="checkpoint directory glob (repeatable)")
    p.add_argument("--max-distance", type=int, default=None,
                   help="largest d of the kernel plot (default: the longest evaluated length)")
    add_common_args(p)
    args = p.parse_args(argv)
    build_report(args.results, args)
    if args.checkpoints:
        from megatron.evaluation.results import load_results

        longest = max(L for r in load_results(args.results, args.meta_from_path) for L in r.ppl)
        kernel_plot(args.checkpoints, args.max_distance or longest, args.out)
    print(f"report written to {args.out}")
    return 0


if __name__ == "__main__":
    run_cli(main, "make_report.py", expected=(ValueError,))
