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

from megatron.cli_args import ArgumentParser
from megatron.errors import run_cli
from study.aggregate import add_common_args, build_report


def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", help="eval.json files, directories (searched recursively) or quoted globs")
    add_common_args(p)
    args = p.parse_args(argv)
    build_report(args.results, args)
    return 0


if __name__ == "__main__":
    run_cli(main, "aggregate_results.py", expected=(ValueError,))
