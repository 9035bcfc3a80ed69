#!/usr/bin/env python
"""Perplexity of checkpoints at many lengths, each checkpoint in one process pass (the paper's
extrapolation evaluation).

    python evaluate.py --checkpoint runs/quickstart/checkpoints --lengths 128,256,512
    python evaluate.py --checkpoint CKPT                 # default: 1x, 2x, ... 32x the train length
    python evaluate.py --checkpoint A B C --out results  # several checkpoints: results/<name>/
    python evaluate.py --checkpoint CKPT --window 128    # windowed attention (the paper's windowed@L)
    python evaluate.py --checkpoint CKPT --stride 64     # sliding-window (strided) evaluation

Writes eval.json (schema kerple-eval/1: lengths -> perplexity, per-position loss), eval.csv,
eval.md and positionwise.csv into --out (default: <checkpoint>/../eval).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, nargs="+", help="directories holding `latest` and global_step<N>/")
    p.add_argument("--iteration", type=int, default=None, help="evaluate global_step<N> instead of latest")
    p.add_argument("--lengths", default=None, help="comma-separated lengths (default: 1x..--max-factor x train length)")
    p.add_argument("--max-factor", type=int, default=32, help="largest multiple of the train length (default 32)")
    p.add_argument("--split", choices=("test", "valid"), default="test")
    p.add_argument("--max-windows", type=int, default=None,
                   help="windows per length (default: the paper's 320 unless --max-tokens is given)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="token budget per length: every length then covers the same leading tokens of the split")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--window", type=int, default=None, help="sliding-window attention W at eval time")
    p.add_argument("--stride", type=int, default=None,
                   help="strided evaluation: windows of each length advance by this many tokens, scoring only "
                        "the new ones (budget: --max-tokens, default 65536)")
    p.add_argument("--attention-backend", default=None, help="override the attention backend")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key of the checkpoint, e.g. -o data-path=data/x/x_text_document")
    p.add_argument("--data-seed", type=int, default=None,
                   help="seed of the split's document order (default: the checkpoint's training seed, as the paper); "
                        "fix it to compare runs of different seeds on the same tokens under a --max-tokens budget")
    p.add_argument("--dataset", default=None, help="dataset name recorded in eval.json (default: from data-path)")
    p.add_argument("--out", default=None, help="output directory (with several checkpoints: one subdirectory each)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    from megatron.interop.safe_load import add_load_flags

    add_load_flags(p)
    return p.parse_args(argv)


def parse_lengths(text: str) -> list[int]:
    try:
        lengths = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"evaluate.py: --lengths {text!r} must be comma-separated integers, e.g. 512,1024") from None
    if not lengths or min(lengths) < 1:
        raise SystemExit(f"evaluate.py: --lengths {text!r} must list positive integers")
    return lengths


def data_source(cfg, split: str) -> tuple[str, str]:
    """(prefix, split string) for the requested split."""
    d = cfg.data
    if d.data_path:
        return d.data_path, d.split
    paths = d.test_data_paths if split == "test" else d.valid_data_paths
    if not paths:
        raise SystemExit(f"evaluate.py: the checkpoint's config has no data-path and no {split}-data-paths; "
                         "pass -o data-path=<prefix>")
    return paths[0], "0,0,1" if split == "test" else "0,1,0"


def train_speed(cfg) -> dict | None:
    """sec/step of the training run (median of its logged steps after the first), if logged."""
    path = os.path.join(cfg.logging.run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    steps = [r["elapsed_time_per_iteration_ms"] for r in rows if r.get("kind") == "train"]
    ms = sorted(steps[1:] or steps)  # the first step pays for warm-up
    return {"sec_per_step": ms[len(ms) // 2] / 1000.0, "steps": len(steps)} if ms else None


def output_dir(args, ckpt: str) -> str:
    if len(args.checkpoint) > 1:
        base = args.out or "eval"
        name = os.path.basename(os.path.normpath(ckpt))
        if name in ("checkpoints", "ckpt"):
            name = os.path.basename(os.path.dirname(os.path.normpath(ckpt)))
        return os.path.join(base, name)
    return args.out or os.path.join(os.path.dirname(os.path.abspath(ckpt)), "eval")


def run_lengths(args, model, cfg, lengths, prefix, split) -> list:
    from megatron.evaluation.lengths import evaluate_length
    from megatron.evaluation.strided import evaluate_strided

    max_windows = args.max_windows if (args.max_windows or args.max_tokens) else 320
    seed = cfg.training.seed if args.data_seed is None else args.data_seed
    results = []
    for L in lengths:
        if args.stride:
            r = evaluate_strided(model, prefix, split, args.split, L, min(args.stride, L), seed,
                                 args.max_tokens or 65536, args.device, cfg.data.data_cache_dir, not args.quiet)
        else:
            r = evaluate_length(model, prefix, split, args.split, L, seed, max_windows,
                                args.max_tokens, args.batch_size, args.device, cfg.data.data_cache_dir,
                                progress=not args.quiet)
        print(f"length {L:>6}: loss {r.loss:.4f}  ppl {r.ppl:10.3f}  ({r.windows} windows, {r.seconds:.1f}s)", flush=True)
        results.append(r)
    return results


def evaluate_checkpoint(args, ckpt: str) -> int:
    from megatron.config import ConfigError
    from megatron.evaluation.lengths import default_lengths
    from megatron.evaluation.load import load_checkpoint_model
    from megatron.evaluation.report import build_record, markdown_table, write_outputs
    from megatron.launcher import parse_overrides
    from megatron.training.checkpoint import CheckpointError

    overrides = parse_overrides(args.override)
    if args.window is not None:
        overrides["attention-window"] = args.window
    if args.attention_backend:
        overrides["attention-backend"] = args.attention_backend
    tag = f"global_step{args.iteration}" if args.iteration is not None else None
    try:
        model, cfg, client = load_checkpoint_model(ckpt, tag, overrides, args.device, args.allow_nonfinite)
    except (CheckpointError, ConfigError) as e:
        print(f"evaluate.py: {e}", file=sys.stderr)
        return 2
    train_len = cfg.model.seq_length
    lengths = parse_lengths(args.lengths) if args.lengths else default_lengths(train_len, args.max_factor)
    limit = model.position.max_length()
    if limit and max(lengths) > limit:
        print(f"evaluate.py: pos-emb {cfg.model.pos_emb} cannot represent lengths {[x for x in lengths if x > limit]} "
              f"(max {limit}); drop them from --lengths", file=sys.stderr)
        return 2
    prefix, split = data_source(cfg, args.split)
    start = time.perf_counter()
    try:
        results = run_lengths(args, model, cfg, lengths, prefix, split)
    except ValueError as e:
        print(f"evaluate.py: {e}", file=sys.stderr)
        return 2
    meta = {
        "checkpoint": os.path.abspath(ckpt), "iteration": client.get("iteration"),
        "pos_emb": cfg.model.pos_emb, "seed": cfg.training.seed, "train_length": train_len,
        "data_seed": cfg.training.seed if args.data_seed is None else args.data_seed,
        "dataset": args.dataset or os.path.basename(prefix).removesuffix("_text_document"),
        "split": args.split, "window": cfg.model.attention_window,
        "mode": "strided" if args.stride else "non-overlapping", "stride": args.stride,
        "data_path": prefix, "device": str(args.device), "lengths": lengths,
        "train_speed": train_speed(cfg), "seconds": round(time.perf_counter() - start, 2),
    }
    rec = build_record(meta, results)
    paths = write_outputs(rec, results, output_dir(args, ckpt))
    print(markdown_table(rec))
    print(f"wrote {paths['json']}, {paths['csv']}, {paths['md']}, {paths['positionwise']}")
    return 0


def main(argv=None) -> int:
    from megatron.interop.safe_load import apply_trust_flag

    args = parse_args(argv)
    apply_trust_flag(args)
    worst = 0
    for ckpt in args.checkpoint:
        worst = max(worst, evaluate_checkpoint(args, ckpt))
    return worst


if __name__ == "__main__":
    sys.exit(main())
