#!/usr/bin/env python
"""Regenerate the offline downstream tasks' data files (megatron/evaluation/harness/tasks/*.jsonl)
from this interpreter's standard library: docstring paragraphs of the quickstart's held-out
documents, drawn with a fixed seed (see megatron/evaluation/harness/local_tasks.py).

    python tools/make_eval_tasks.py                 # rewrite the committed files
    python tools/make_eval_tasks.py --out /tmp/t    # write elsewhere (e.g. to compare)

The committed files are what every machine scores; regenerate only to change the tasks (another
Python version's stdlib gives other paragraphs).
"""
from __future__ import annotations

import argparse
import os

from megatron.cli_args import ArgumentParser
from megatron.errors import run_cli
from megatron.evaluation.harness.local_tasks import DATA_DIR, build_task_files


def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=DATA_DIR, help=f"output directory (default: {os.path.relpath(DATA_DIR)})")
    p.add_argument("--lastword", type=int, default=500, help="at most this many last-word documents")
    p.add_argument("--choice", type=int, default=300, help="at most this many multiple-choice documents")
    args = p.parse_args(argv)
    counts = build_task_files(args.lastword, args.choice, args.out)
    for name, n in counts.items():
        print(f"{name}: {n} documents -> {os.path.join(args.out, name + '.jsonl')}")
    return 0


if __name__ == "__main__":
    run_cli(main, "make_eval_tasks.py")
