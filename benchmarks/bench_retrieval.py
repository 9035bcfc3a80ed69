#!/usr/bin/env python
"""What retrieval's multiple choice costs against one forward over the haystack: the K candidates
share the prompt's forward (megatron/evaluation/retrieval/scoring.py), so scoring them should cost
about one forward, not K (the issue's bound: at most 1.3x at 16x the train length).

The quickstart's model shape (4 layers, width 256, 4 heads, vocabulary 8192, train length 128),
random weights, on kv prompts of each length. Variants, INTERLEAVED per repetition (each repetition
times every variant in turn, so a neighbour process slows all alike) and reported as the median
over repetitions and its ratio to `forward`:

    forward      one prompt's forward into the kv-cache and its last position's distribution
    choice       the same prompt's K candidates scored by likelihood (the forward included)
    choice+gen   the same plus greedy generation of the answer's tokens
    K forwards   the naive way: each candidate appended to the prompt, a full forward each (K=10: only
                 at the shorter lengths unless --naive-all)

    python tools/bench_retrieval.py --lengths 128 2048 --threads 1
"""
from __future__ import annotations

import os
import statistics
import time

from megatron.cli_args import ArgumentParser, int_at_least
from megatron.config.model import ModelConfig
from megatron.errors import UserError
from megatron.evaluation.retrieval.prompts import PromptMaker, SentenceFiller
from megatron.tokenizer import build_tokenizer


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lengths", nargs="+", type=int_at_least(1), default=[128, 2048])
    p.add_argument("--candidates", type=int_at_least(2), default=10)
    p.add_argument("--pos-emb", default="kerple_log")
    p.add_argument("--reps", type=int_at_least(1), default=5)
    p.add_argument("--threads", type=int_at_least(1), default=1)
    p.add_argument("--naive-all", action="store_true", help="time K full forwards at every length")
    p.add_argument("--vocab-file", default="data/retrieval/tokenizer.json",
                   help="the tokenizer the prompts are spelled with (default: the retrieval corpus's BPE, built by "
                        "python tools/prepare_data.py retrieval)")
    return p.parse_args(argv)


def forward_only(model, prompt) -> None:
    import torch  # lazy: torch; --help needs none

    cache = model.new_cache()
    last = model.hidden_states(torch.tensor([prompt.tokens]), cache=cache)[:, -1:]
    torch.log_softmax(model.logits(last).float(), -1)


def k_forwards(model, prompt) -> None:
    import torch  # lazy: torch; --help needs none

    for c in prompt.candidates:
        model(torch.tensor([prompt.tokens + c]))


def main(argv=None) -> int:
    args = parse_args(argv)
    # lazy: torch and the model; --help needs none
    import torch

    from megatron.evaluation.retrieval.scoring import score_prompts
    from megatron.model import GPTModel

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = ModelConfig(num_layers=4, hidden_size=256, num_attention_heads=4, seq_length=128, pos_emb=args.pos_emb,
                      max_position_embeddings=128)
    model = GPTModel(cfg, 8192).eval()
    if not os.path.isfile(args.vocab_file):
        raise UserError(f"{args.vocab_file} not found: build it with python tools/prepare_data.py retrieval --data-dir "
                        "data, or pass --vocab-file")
    tok = build_tokenizer("HFTokenizer", args.vocab_file)
    maker = PromptMaker("kv", tok, SentenceFiller(tok), args.candidates, seed=0)
    print(f"retrieval scoring cost, {args.pos_emb}, quickstart shape, K={args.candidates}, {args.threads} thread(s), "
          f"median of {args.reps}")
    print("| length | forward ms | choice ms | x forward | choice+gen ms | x forward | K forwards ms | x forward |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    with torch.no_grad():
        for length in args.lengths:
            prompt = maker.make(length, 50, 0)
            variants = {"forward": lambda p=prompt: forward_only(model, p),
                        "choice": lambda p=prompt: score_prompts(model, [p], "cpu", generate=False),
                        "choice+gen": lambda p=prompt: score_prompts(model, [p], "cpu", generate=True)}
            if args.naive_all or length <= 512:
                variants["K forwards"] = lambda p=prompt: k_forwards(model, p)
            for fn in variants.values():
                fn()  # warm-up
            times = {name: [] for name in variants}
            for _ in range(args.reps):
                for name, fn in variants.items():
                    start = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - start)
            ms = {name: 1000 * statistics.median(t) for name, t in times.items()}
            base = ms["forward"]
            naive = (f"{ms['K forwards']:.1f} | {ms['K forwards'] / base:.2f}" if "K forwards" in ms else "- | -")
            print(f"| {length} | {base:.1f} | {ms['choice']:.1f} | {ms['choice'] / base:.2f} | {ms['choice+gen']:.1f} | "
                  f"{ms['choice+gen'] / base:.2f} | {naive} |")
    return 0
