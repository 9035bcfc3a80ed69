#!/usr/bin/env python
"""Write the experiment matrix (schemes x datasets x seeds) as YAML files plus matrix.json.

    # the paper's Table 3 matrix (30 runs of the 162M model; run on GPUs / a cluster)
    python tools/make_experiments.py --out configs/experiments/paper \\
        --base configs/paper/local_setup.yml configs/paper/train.yml \\
        --schemes kerple_log,kerple_power_ap_,alibi,rpe,rotary,sinusoidal \\
        --data openwebtext2=data/openwebtext2/openwebtext2_text_document \\
               github=data/github/github_text_document arxiv=data/arxiv/arxiv_text_document \\
        --seeds 1235-1239

    # the train-length trend (docs/results, reproduction v3): the same tokens per step at every length
    python tools/make_experiments.py ... --train-lengths 128,256 --tokens-per-step 1024 --order dataset
    # the same with a recipe change for every run (a config key and its value, checked against the base)
    python tools/make_experiments.py ... --train-lengths 64,128,256 --tokens-per-step 1024 --set warmup=0.1
    # or the same sequences per step at every length (the tokens grow with L)
    python tools/make_experiments.py ... --train-lengths 64,128,256 --sequences-per-step 16 --set warmup=0.1

Then run it locally with tools/run_matrix.py, or on slurm with tools/slurm/matrix.sbatch.
"""
import argparse
import json
import os

from megatron.cli_args import ArgumentParser, int_at_least
from megatron.config import load_config
from megatron.errors import UserError
from study.experiments import ORDERS, parse_data, write_matrix


def parse_seeds(text: str) -> list[int]:
    try:
        if "-" in text:
            lo, hi = text.split("-", 1)
            return list(range(int(lo), int(hi) + 1))
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise UserError(f"--seeds {text!r}: give a range like 1235-1239 or a list like 1,2,3") from None


def parse_settings(items: list[str], base: list[str]) -> dict:
    """--set KEY=VALUE ... -> {key: value} (VALUE read as JSON when it is JSON: 0.1, true, [0.9, 0.99]),
    checked by loading the base configs with them, so a misspelt key is refused before any file is written."""
    out = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--set {item!r} must look like KEY=VALUE (e.g. warmup=0.1)")
        try:
            out[key.strip()] = json.loads(text)
        except ValueError:
            out[key.strip()] = text
    if out:
        try:
            load_config(base, overrides=out)
        except UserError as e:
            raise UserError(f"--set does not fit the base configs: {e}") from None
    return out


def main() -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory for the experiment YAMLs and matrix.json")
    p.add_argument("--base", nargs="+", required=True, help="shared config files, before each experiment's YAML")
    p.add_argument("--schemes", required=True, help="comma-separated pos-emb names")
    p.add_argument("--data", nargs="+", required=True, metavar="NAME=PREFIX", help="datasets")
    p.add_argument("--vocab", nargs="+", default=[], metavar="NAME=TOKENIZER_FILE",
                   help="a dataset's own tokenizer file (vocab-file of its runs), e.g. code=data/code/tokenizer.json")
    p.add_argument("--seeds", default="1235-1239", help="e.g. 1235-1239 or 1,2,3")
    p.add_argument("--runs-root", default="runs/matrix", help="where each run's directory goes")
    p.add_argument("--train-lengths", default=None,
                   help="comma-separated train lengths: each run sets seq-length and the length-scaled scheme "
                        "settings (study/experiments.py length_settings); needs --tokens-per-step or "
                        "--sequences-per-step")
    steps = p.add_mutually_exclusive_group()
    steps.add_argument("--tokens-per-step", type=int_at_least(1), default=None,
                       help="with --train-lengths: micro batch = this // L, so every length trains on the same tokens")
    steps.add_argument("--sequences-per-step", type=int_at_least(1), default=None,
                       help="with --train-lengths: micro batch = this at every L, so the tokens grow with L")
    p.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", dest="settings",
                   help="a config key every run of the matrix sets (after the base configs), e.g. warmup=0.1")
    p.add_argument("--order", choices=sorted(ORDERS), default="seed",
                   help="; ".join(f"{k}: {v}" for k, v in ORDERS.items()))
    args = p.parse_args()
    try:
        lengths = [int(x) for x in args.train_lengths.split(",")] if args.train_lengths else None
    except ValueError:
        raise UserError(f"--train-lengths {args.train_lengths!r}: give integers like 128,256") from None
    missing = [b for b in args.base if not os.path.isfile(b)]
    if missing:
        raise UserError(f"--base config files not found: {', '.join(missing)}")
    extra = parse_settings(args.settings, args.base)
    runs = write_matrix(args.schemes.split(","), parse_data(args.data), parse_seeds(args.seeds), args.out,
                        args.runs_root, args.base, extra=extra, vocab_files=parse_data(args.vocab, "NAME=TOKENIZER_FILE"),
                        train_lengths=lengths, tokens_per_step=args.tokens_per_step, order=args.order,
                        sequences_per_step=args.sequences_per_step)
    print(f"wrote {len(runs)} experiment configs and {os.path.join(args.out, 'matrix.json')}")
    return 0
