"""Whole-model evaluation forward on CPU: our GPT per positional scheme against Hugging Face's
GPTNeoX (rotary) on the same shapes, one no-grad forward per call, as one markdown table.

Every variant is built once (same seed, random weights) and the variants are INTERLEAVED: each
repetition times one forward of every variant in turn, so a neighbour process slowing the box
slows all of them alike and the `x none` ratios (median over repetitions, same process, same
length) stay meaningful on a shared machine even when the absolute ms do not.

Variants (names for --variants):
    none, alibi, kerple_log, ...   GPTModel with that pos-emb and attention-backend `auto`
    SCHEME@BACKEND                 the same with an explicit backend, e.g. kerple_log@flex
    hf_neox                        transformers' GPTNeoXForCausalLM (rotary), built from a config

A compiled backend (flex) compiles on its first call at each length; that call is the warm-up
and is reported on its own (`first call s`), never in the median.

    python tools/bench_eval_forward.py --lengths 2048 4096 --threads 1
    python tools/bench_eval_forward.py --variants none kerple_log kerple_log@flex --lengths 8192 16384
"""
from __future__ import annotations

import os
import statistics
import sys
import time

import torch

from megatron.cli_args import ArgumentParser
from megatron.config import load_config
from megatron.model import GPTModel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DEFAULT_VARIANTS = ["none", "alibi", "kerple_log", "hf_neox"]


def parse_args(argv):
    p = ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS)
    p.add_argument("--lengths", nargs="+", type=int, default=[2048, 4096])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args(argv)


def build_ours(args, scheme: str, backend: str):
    cfg = load_config([os.path.join(ROOT, "configs", "quickstart.yml")], overrides={
        "num-layers": args.layers, "hidden-size": args.hidden, "num-attention-heads": args.heads,
        "pos-emb": scheme, "attention-backend": backend,
        "seq-length": max(args.lengths), "max-position-embeddings": max(args.lengths)})
    torch.manual_seed(args.seed)
    model = GPTModel(cfg.model, args.vocab).eval()
    return lambda tokens: model(tokens)


def build_hf(args):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM  # lazy: transformers (~0.7 s) only for the hf_neox row

    cfg = GPTNeoXConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                        num_attention_heads=args.heads, intermediate_size=4 * args.hidden,
                        max_position_embeddings=max(args.lengths), rotary_pct=1.0, use_cache=False,
                        hidden_dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(args.seed)
    model = GPTNeoXForCausalLM(cfg).eval()
    return lambda tokens: model(input_ids=tokens, use_cache=False).logits


def build(args, variant: str):
    if variant == "hf_neox":
        return build_hf(args)
    scheme, _, backend = variant.partition("@")
    return build_ours(args, scheme, backend or "auto")


def timed(fn, tokens) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        fn(tokens)
    return time.perf_counter() - start


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(args.threads)
    models = {v: build(args, v) for v in args.variants}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {args.layers}x{args.hidden} "
          f"({args.heads} heads), vocab {args.vocab}, batch 1, fp32, median of {args.reps}", flush=True)
    rows = []
    for L in args.lengths:
        tokens = torch.randint(0, args.vocab, (1, L), generator=torch.Generator().manual_seed(L))
        first = {v: timed(fn, tokens) for v, fn in models.items()}  # warm-up / compile
        times = {v: [] for v in models}
        for _ in range(args.reps):
            for v, fn in models.items():
                times[v].append(timed(fn, tokens))
        med = {v: statistics.median(t) for v, t in times.items()}
        base = med.get("none")
        for v in models:
            ratio = f"{med[v] / base:.2f}" if base else "-"
            rows.append(f"| {L} | {v} | {med[v] * 1e3:,.0f} | {ratio} | {first[v]:.1f} |")
            print(rows[-1], flush=True)
    print("\n| tokens | variant | ms | x none | first call s |\n|---:|---|---:|---:|---:|")
    print("\n".join(rows))
    return 0
