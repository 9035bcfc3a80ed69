#!/usr/bin/env python
"""Perplexity of one checkpoint at many lengths, in one process (the paper's extrapolation eval).

    python evaluate.py --checkpoint runs/quickstart/checkpoints --lengths 128,256,512
    python evaluate.py --checkpoint CKPT            # default: 1x, 2x, ... 32x the train length

Writes eval.json (schema kerple-eval/1: lengths -> perplexity, per-position loss), eval.csv,
eval.md and positionwise.csv into --out (default: <checkpoint>/../eval).
"""
from __future__ import annotations

import argparse
import os
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="directory holding `latest` and global_step<N>/")
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
    p.add_argument("--attention-backend", default=None, help="override the attention backend")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key of the checkpoint, e.g. -o data-path=data/x/x_text_document")
    p.add_argument("--out", default=None, help="output directory")
    p.add_argument("--device", default="cpu")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
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


def main(argv=None) -> int:
    args = parse_args(argv)
    from megatron.config import ConfigError
    from megatron.evaluation.lengths import default_lengths, evaluate_length
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
        model, cfg, client = load_checkpoint_model(args.checkpoint, tag, overrides, args.device)
    except (CheckpointError, ConfigError) as e:
        print(f"evaluate.py: {e}", file=sys.stderr)
        return 2
    train_len = cfg.model.seq_length
    lengths = parse_lengths(args.lengths) if args.lengths else default_lengths(train_len, args.max_factor)
    if not model.position.extrapolates:
        too_long = [L for L in lengths if model.position.max_length() and L > model.position.max_length()]
        if too_long:
            print(f"evaluate.py: pos-emb {cfg.model.pos_emb} cannot represent lengths {too_long} "
                  f"(max {model.position.max_length()}); drop them from --lengths", file=sys.stderr)
            return 2
    prefix, split = data_source(cfg, args.split)
    max_windows = args.max_windows if (args.max_windows or args.max_tokens) else 320
    results, start = [], time.perf_counter()
    for L in lengths:
        try:
            r = evaluate_length(model, prefix, split, args.split, L, cfg.training.seed, max_windows,
                                args.max_tokens, args.batch_size, args.device, cfg.data.data_cache_dir,
                                progress=not args.quiet)
        except ValueError as e:
            print(f"evaluate.py: length {L}: {e}", file=sys.stderr)
            return 2
        print(f"length {L:>6}: loss {r.loss:.4f}  ppl {r.ppl:10.3f}  ({r.windows} windows, {r.seconds:.1f}s)", flush=True)
        results.append(r)
    meta = {
        "checkpoint": os.path.abspath(args.checkpoint), "iteration": client.get("iteration"),
        "pos_emb": cfg.model.pos_emb, "train_length": train_len, "split": args.split,
        "window": cfg.model.attention_window, "data_path": prefix, "device": str(args.device),
        "lengths": lengths, "seconds": round(time.perf_counter() - start, 2),
    }
    rec = build_record(meta, results)
    out_dir = args.out or os.path.join(os.path.dirname(os.path.abspath(args.checkpoint)), "eval")
    paths = write_outputs(rec, results, out_dir)
    print(markdown_table(rec))
    print(f"wrote {paths['json']}, {paths['csv']}, {paths['md']}, {paths['positionwise']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
