"""The training data path alone, timed: how many tokens per second the loader hands the trainer
for the paper's config (issue 42 part 2 asks whether data loading is where deepy.py's time goes).

It runs what train.py runs before a step, on a random corpus of the paper's vocabulary (50,304,
benchmarks/corpus.py, so no tokenizer or download): the GPT dataset's sample index, built once
(timed apart: a run builds it at start-up and caches it), then megatron/data/loader.py's
batch_loader and, as deepy.py takes the paper's config through DeepSpeed's pipeline engine, its
pipe_batches (tokens, labels, loss mask), for each --workers count. Per row: the first batch's
latency (worker start-up included), then tokens/s over the rest, and that rate against a
trainer's need at --goal tokens/s (the issue's 250K on one GPU).

    python tools/bench_data_loader.py                                      # paper's config, workers 0 and 2
    python tools/bench_data_loader.py --out docs/benchmarks.md --section data-loader
    python tools/bench_data_loader.py --steps 50 --workers 0               # quicker

A CPU-only measurement: the loader never touches a GPU (the batch's copy to the device is the
trainer's, 3 x 64 KiB per micro-batch of the paper's config). tools/gpu_throughput.py runs
deepy.py with num-workers 0, so its tokens/s include loading in the training process: the
workers 0 row is what that costs there.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch
import yaml

from benchmarks.cli import check_positive, set_threads
from benchmarks.corpus import VOCAB, write_corpus
from benchmarks.report import SECTION_NAME, environment_lines, markdown_table, replace_section
from megatron.cli_args import ArgumentParser
from megatron.config import load_config
from megatron.data.loader import batch_loader
from megatron.training.data_setup import build_datasets
from megatron.training.pipeline_step import pipe_batches

PAPER = ["configs/paper/local_setup.yml", "configs/paper/train.yml"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="+", default=PAPER, help="YAML files merged in order (default: the paper's)")
    p.add_argument("--steps", type=int, default=200, help="micro-batches read per row (default 200)")
    p.add_argument("--workers", nargs="+", type=int, default=[0, 2],
                   help="DataLoader worker processes, one row each (default 0 and 2: the config key's default)")
    p.add_argument("--goal", type=float, default=250_000, help="tokens/s a trainer needs (default 250000)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: a shared machine)")
    p.add_argument("--out", default=None, help="markdown file whose section to rewrite (e.g. docs/benchmarks.md)")
    p.add_argument("--section", default="data-loader", help="section name in --out (default data-loader)")
    p.add_argument("--note", default=None, help="a line for the section: what else ran on the machine")
    args = p.parse_args(argv)
    check_positive(p, steps=args.steps, goal=args.goal)
    if any(w < 0 for w in args.workers):
        p.error(f"--workers must be >= 0, got {args.workers}")
    if not SECTION_NAME.match(args.section):
        p.error(f"--section {args.section!r}: use lowercase letters, digits, '-' and '_'")
    set_threads(p, args.threads)
    return args


def config_for(tmp: str, configs: list[str], steps: int):
    """The configs with a random corpus as their data (enough for `steps` micro-batches, each
    sample read once) and every other path inside tmp."""
    paths = [c if os.path.isabs(c) else os.path.join(ROOT, c) for c in configs]
    first = load_config(paths)
    micro, seq = first.training.train_micro_batch_size_per_gpu, first.model.seq_length
    data = write_corpus(os.path.join(tmp, "random_text_document"), (steps + 2) * micro * (seq + 1), VOCAB)
    override = {"data-path": data, "tokenizer-type": "CharLevelTokenizer", "padded-vocab-size": VOCAB,
                "split": "100,0,0", "train-iters": steps, "eval-iters": 0, "run-dir": os.path.join(tmp, "run"),
                "data-cache-dir": os.path.join(tmp, "cache"), "tensorboard-dir": os.path.join(tmp, "tb")}
    path = os.path.join(tmp, "data.yml")
    with open(path, "w") as f:
        yaml.safe_dump(override, f)
    return load_config([*paths, path])


def read_batches(dataset, cfg, steps: int, workers: int) -> tuple[float, float, int]:
    """(first batch's seconds, the rest's tokens/s, tokens per micro-batch) through the pipe path."""
    micro, seq = cfg.training.train_micro_batch_size_per_gpu, cfg.model.seq_length
    start = time.perf_counter()
    batches = pipe_batches(iter(batch_loader(dataset, micro, 1, 0, 1, 0, steps, workers, cfg.training.seed)),
                           None, cfg.data.eod_mask_loss)
    (tokens,), (labels, mask) = next(batches)
    first = time.perf_counter() - start
    assert tokens.shape == labels.shape == mask.shape == (micro, seq), (tokens.shape, micro, seq)
    start, n = time.perf_counter(), 0
    for _ in batches:
        n += 1
    rest = time.perf_counter() - start
    return first, n * micro * seq / rest, micro * seq


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_data_loader_") as tmp:
        cfg = config_for(tmp, args.configs, args.steps)
        start = time.perf_counter()
        train, _, _ = build_datasets(cfg, cfg.training.train_micro_batch_size_per_gpu, VOCAB)
        index_seconds = time.perf_counter() - start
        for workers in args.workers:
            first, rate, per_batch = read_batches(train, cfg, args.steps, workers)
            rows.append([workers, f"{first:.3f}", args.steps - 1, f"{rate:,.0f}", f"{rate / args.goal:.1f}x",
                         f"{per_batch / rate * 1e3:.2f}"])
            print(f"[bench_data_loader] workers {workers}: first batch {first:.3f} s, {rate:,.0f} tokens/s",
                  file=sys.stderr, flush=True)
    lines = ["## The training data path alone (`tools/bench_data_loader.py`)", "",
             *environment_lines(torch.device("cpu"), "tools/bench_data_loader.py", argv),
             f"- configs: {', '.join(args.configs)}; micro-batch {cfg.training.train_micro_batch_size_per_gpu} x "
             f"{cfg.model.seq_length} tokens, a random corpus of vocabulary {VOCAB:,} (uint16 ids, 1,024-token documents)",
             f"- sample index built once: {index_seconds:.2f} s ({len(train):,} samples; a run builds it at start-up "
             "and caches it in data-cache-dir)",
             "- a micro-batch = batch_loader's batch through pipe_batches (tokens, labels, loss mask), deepy.py's "
             "path for the paper's config; the copy to a GPU is not included",
             f"- vs goal: tokens/s over {args.goal:,.0f} (a trainer at the goal needs one micro-batch every "
             f"{cfg.training.train_micro_batch_size_per_gpu * cfg.model.seq_length / args.goal * 1e3:.1f} ms)"]
    if args.note:
        lines.append(f"- {args.note}")
    lines += ["", markdown_table(["workers", "first batch s", "batches timed", "tokens/s", "vs goal",
                                  "ms per micro-batch"], rows, right={0, 1, 2, 3, 4, 5})]
    text = "\n".join(lines)
    print(text)
    if args.out:
        replace_section(args.out, args.section, text)
    return 0
