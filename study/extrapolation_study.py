#!/usr/bin/env python
"""Length extrapolation, scheme against scheme and recipe against recipe: the quickstart's model
trained on the retrieval corpus once per positional scheme and training recipe, then perplexity and
the kv needle grid at 1x .. 16x for each, with window attention (the first scheme's plain model
read with a window of the train length) beside them, in one table.

    python tools/extrapolation_study.py --out runs/study                      # on a GPU: see --batch, --train-iters
    python tools/extrapolation_study.py --out runs/recipes --schemes kerple_log rotary none \\
        --recipes plain randomized pose --backend sdpa                        # issue 56's study
    python tools/extrapolation_study.py --out /tmp/s --tiny                   # the plumbing, in a minute on a CPU

Recipes (docs/config.md): plain; randomized (Ruoss et al.: `pos-random-max-length` = --recipe-length);
pose (Zhu et al.: `pos-skip-target-length` = --recipe-length). Both change only training's positions,
and only the sdpa and reference backends take them (--backend sdpa on a GPU).

Each run is `deepy.py train.py configs/quickstart.yml configs/retrieval.yml -o pos-emb=S ...` in
OUT/S (OUT/S_RECIPE for a recipe; a finished run is not trained again, an interrupted one resumes),
then `evaluate.py --retrieval kv` into its eval/; tools/compare_runs.py writes OUT/compare/compare.md.
The retrieval corpus is built first where there is none (~15 s). Why a tool: the comparison is fair
only when every run has the same data, steps, batch and prompts, so they are set here once. Measured on
a 2-core CPU: 400-800 steps of batch 16 do not teach the copy (docs/evaluation.md, "A retrieval
corpus"), so the defaults are sized for a GPU.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

from megatron.cli_args import ArgumentParser, int_at_least
from megatron.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMES = ("kerple_log", "alibi", "rotary", "none")
TRAIN_LENGTH = 128  # configs/quickstart.yml's seq-length: the window of window attention
RECIPES = {  # recipe -> the config key its length goes to (None: consecutive positions)
    "plain": None,
    "randomized": "pos-random-max-length",
    "pose": "pos-skip-target-length",
}


def run(argv: list[str]) -> None:
    print("extrapolation_study: " + " ".join(argv), flush=True)
    rc = subprocess.call([sys.executable, *argv], cwd=ROOT)
    if rc != 0:
        raise UserError(f"{argv[0]} exited {rc}; its output is above. Fix what it names and run the same command "
                        "again: finished runs are not redone")


def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="one run directory per scheme and recipe, and compare/")
    p.add_argument("--schemes", nargs="+", default=list(SCHEMES), help="pos-emb values (the first also gives "
                   "window attention)")
    p.add_argument("--recipes", nargs="+", default=["plain"], choices=sorted(RECIPES), help="training recipes")
    p.add_argument("--recipe-length", type=int_at_least(TRAIN_LENGTH + 1), default=16 * TRAIN_LENGTH,
                   help="the position range of randomized positions and PoSE's target length")
    p.add_argument("--train-iters", type=int_at_least(1), default=3000)
    p.add_argument("--batch", type=int_at_least(1), default=64, help="train_micro_batch_size_per_gpu")
    p.add_argument("--max-factor", type=int_at_least(1), default=16, help="evaluation at 1x .. this x 128 tokens")
    p.add_argument("--prompts", type=int_at_least(1), default=50, help="retrieval prompts per length x depth cell")
    p.add_argument("--data-dir", default="data", help="where tools/prepare_data.py retrieval puts the corpus")
    p.add_argument("--device", default="auto")
    p.add_argument("--backend", default="auto", help="attention-backend of every run")
    p.add_argument("--table", default=None, help="also copy the comparison (compare.md) to this file")
    p.add_argument("--tiny", action="store_true", help="4 steps, 2 prompts, 1x-2x (recipes to 2x): the plumbing, not a result")
    args = p.parse_args(argv)
    data = os.path.join(args.data_dir, "retrieval")
    if not os.path.isfile(os.path.join(data, "retrieval_text_document.bin")):  # ~15 s: built where it runs
        run(["tools/prepare_data.py", "retrieval", "--data-dir", args.data_dir])
    iters, prompts, factor = (4, 2, 2) if args.tiny else (args.train_iters, args.prompts, args.max_factor)
    recipe_length = TRAIN_LENGTH * factor if args.tiny else args.recipe_length
    same = ["-o", f"data-path={data}/retrieval_text_document", "-o", f"vocab-file={data}/tokenizer.json",
            "-o", f"train-iters={iters}", "-o", f"train_micro_batch_size_per_gpu={args.batch}",
            "-o", f"save-interval={iters}", "-o", f"eval-interval={iters}", "-o", f"device={args.device}",
            "-o", f"attention-backend={args.backend}"]
    grid = ["--max-factor", str(factor), "--max-tokens", str(TRAIN_LENGTH * factor * 2), "--window-order", "contiguous",
            "--retrieval", "kv", "--retrieval-depths", "0,25,50,75,100", "--retrieval-prompts", str(prompts),
            "--device", args.device, "--overwrite"]
    out = os.path.abspath(args.out)
    runs = []
    for recipe in args.recipes:
        key = RECIPES[recipe]
        for scheme in args.schemes:
            run_dir = os.path.join(out, scheme if key is None else f"{scheme}_{recipe}")
            run(["deepy.py", "train.py", "configs/quickstart.yml", "configs/retrieval.yml", "-o", f"pos-emb={scheme}",
                 "-o", f"run-dir={run_dir}", *same, *([] if key is None else ["-o", f"{key}={recipe_length}"])])
            run(["evaluate.py", "--checkpoint", os.path.join(run_dir, "checkpoints"), "--out",
                 os.path.join(run_dir, "eval"), *grid])
            runs.append(run_dir)
    if "plain" in args.recipes:
        window = os.path.join(out, f"window{TRAIN_LENGTH}")
        run(["evaluate.py", "--checkpoint", os.path.join(out, args.schemes[0], "checkpoints"), "--window",
             str(TRAIN_LENGTH), "--out", os.path.join(window, "eval"), *grid])
        runs.append(window)
    if len(runs) < 2:
        raise UserError("one run has nothing to be compared with: name two schemes or recipes, or keep `plain` "
                        "(it adds window attention)")
    compare = os.path.join(out, "compare")
    run(["tools/compare_runs.py", *runs, "--out", compare])
    if args.table:
        shutil.copyfile(os.path.join(compare, "compare.md"), args.table)
    return 0
