#!/usr/bin/env python
"""Retrieval at length, scheme against scheme: the quickstart's model trained on the retrieval
corpus once per positional scheme, then the kv needle grid at 1x .. 16x for each, and window
attention (the first scheme's model read with a window of the train length), side by side.

    python tools/prepare_data.py retrieval --data-dir data          # once
    python tools/retrieval_study.py --out runs/retrieval_study      # on a GPU: see --batch, --train-iters
    python tools/retrieval_study.py --out /tmp/rs --tiny            # the plumbing, in a minute on a CPU

Each scheme is `deepy.py train.py configs/quickstart.yml configs/retrieval.yml -o pos-emb=S` in
OUT/S (a finished run is not trained again, an interrupted one resumes), then `evaluate.py
--retrieval kv` into OUT/S/eval; at the end tools/compare_runs.py writes OUT/compare/compare.md:
perplexity and retrieval accuracy per length, the effective lengths. Why a tool: the comparison is
only fair when every scheme has the same data, steps, batch and prompts, so they are set here once.
Measured on a 2-core CPU: 400-800 steps of batch 16 do not teach the copy (docs/evaluation.md, "A
retrieval corpus"), so the defaults are sized for a GPU.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

from megatron.cli_args import ArgumentParser, int_at_least
from megatron.errors import UserError, run_cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMES = ("kerple_log", "alibi", "rotary", "none")
TRAIN_LENGTH = 128  # configs/quickstart.yml's seq-length: the window of window attention


def run(argv: list[str]) -> None:
    print("retrieval_study: " + " ".join(argv), flush=True)
    rc = subprocess.call([sys.executable, *argv], cwd=ROOT)
    if rc != 0:
        raise UserError(f"{argv[0]} exited {rc}; its output is above. Fix what it names and run the same command "
                        "again: finished schemes are not redone")


def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="one run directory per scheme, and compare/")
    p.add_argument("--schemes", nargs="+", default=list(SCHEMES), help="pos-emb values (the first also gives "
                   "window attention)")
    p.add_argument("--train-iters", type=int_at_least(1), default=3000)
    p.add_argument("--batch", type=int_at_least(1), default=64, help="train_micro_batch_size_per_gpu")
    p.add_argument("--max-factor", type=int_at_least(1), default=16, help="retrieval at 1x .. this x 128 tokens")
    p.add_argument("--prompts", type=int_at_least(1), default=50, help="prompts per length x depth cell")
    p.add_argument("--data-dir", default="data", help="where tools/prepare_data.py retrieval put the corpus")
    p.add_argument("--device", default="auto")
    p.add_argument("--table", default=None, help="also copy the comparison (compare.md) to this file")
    p.add_argument("--tiny", action="store_true", help="4 steps, 2 prompts, 1x-2x: the plumbing, not a result")
    args = p.parse_args(argv)
    data = os.path.join(args.data_dir, "retrieval")
    if not os.path.isfile(os.path.join(data, "retrieval_text_document.bin")):  # ~15 s: built where it runs
        run(["tools/prepare_data.py", "retrieval", "--data-dir", args.data_dir])
    iters, prompts, factor = (4, 2, 2) if args.tiny else (args.train_iters, args.prompts, args.max_factor)
    same = ["-o", f"data-path={data}/retrieval_text_document", "-o", f"vocab-file={data}/tokenizer.json",
            "-o", f"train-iters={iters}", "-o", f"train_micro_batch_size_per_gpu={args.batch}",
            "-o", f"save-interval={iters}", "-o", f"eval-interval={iters}", "-o", f"device={args.device}"]
    grid = ["--max-factor", str(factor), "--max-tokens", str(TRAIN_LENGTH * factor * 2), "--window-order", "contiguous",
            "--retrieval", "kv", "--retrieval-depths", "0,25,50,75,100", "--retrieval-prompts", str(prompts),
            "--device", args.device, "--overwrite"]
    runs = []
    for scheme in args.schemes:
        run_dir = os.path.join(os.path.abspath(args.out), scheme)
        run(["deepy.py", "train.py", "configs/quickstart.yml", "configs/retrieval.yml", "-o", f"pos-emb={scheme}",
             "-o", f"run-dir={run_dir}", *same])
        run(["evaluate.py", "--checkpoint", os.path.join(run_dir, "checkpoints"), "--out",
             os.path.join(run_dir, "eval"), *grid])
        runs.append(run_dir)
    window = os.path.join(os.path.abspath(args.out), f"window{TRAIN_LENGTH}")
    run(["evaluate.py", "--checkpoint", os.path.join(runs[0], "checkpoints"), "--window", str(TRAIN_LENGTH),
         "--out", os.path.join(window, "eval"), *grid])
    compare = os.path.join(os.path.abspath(args.out), "compare")
    run(["tools/compare_runs.py", *runs, window, "--out", compare])
    if args.table:
        shutil.copyfile(os.path.join(compare, "compare.md"), args.table)
    return 0


if __name__ == "__main__":
    run_cli(main, "retrieval_study.py")
