r"""Many eval.json files (schemes x seeds x datasets) -> Table 3 / Table 4 layouts + plots.

    python tools/aggregate_results.py 'runs/**/eval.json' --out docs/results
    python tools/aggregate_results.py runs/ --out docs/results \
        --meta-from-path 'runs/(?P<dataset>[^/]+)/(?P<scheme>[^/]+)_s(?P<seed>\d+)/' --speed speed.json

Writes table3.md, table3.csv, speed.md, ppl_vs_length_<group>.png and positionwise_<group>.png (a group is a
dataset at one train length: <dataset>_L<train length>).
A † marks a scheme's cell where --reference (default kerple_log) is significantly better, ‡ where it is
significantly worse (paired two-sided t-test over seeds, Holm-Bonferroni adjusted over the row's lengths,
alpha 0.05; table3.csv has the raw, adjusted and exact sign-flip p).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere

from megatron.cli_args import ArgumentParser  # noqa: E402
from megatron.errors import run_cli  # noqa: E402


def add_common_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="output directory for tables and plots")
    p.add_argument("--reference", default="kerple_log", help="scheme the t-test compares every other scheme with")
    p.add_argument("--alpha", type=float, default=0.05, help="significance level of the paired t-test")
    p.add_argument("--meta-from-path", default=None, metavar="REGEX",
                   help="regex with named groups scheme/dataset/seed, applied to each file's path for keys its JSON lacks")
    p.add_argument("--speed", default=None, metavar="JSON",
                   help='JSON mapping run -> sec/step; run is "scheme/dataset/seed" or a directory holding eval.json')
    p.add_argument("--digits", type=int, default=2, help="decimals in the table cells")


def build_report(results, args, log=print) -> dict:
    from study.aggregate import apply_speed, load_speed_file, write_report
    from study.results import load_results

    runs = load_results(results, args.meta_from_path)
    if args.speed:
        apply_speed(runs, load_speed_file(args.speed))
    log(f"{len(runs)} result files: {len({r.scheme for r in runs})} schemes, "
        f"{len({r.dataset for r in runs})} datasets, {len({r.seed for r in runs})} seeds")
    return write_report(runs, args.out, args.reference, args.alpha, args.digits, log)


def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", help="eval.json files, directories (searched recursively) or quoted globs")
    add_common_args(p)
    args = p.parse_args(argv)
    build_report(args.results, args)
    return 0


if __name__ == "__main__":
    run_cli(main, "aggregate_results.py", expected=(ValueError,))
