"""Packed-document masking against the unmasked step on CPU at the quickstart size: one training
step (forward + backward) of configs/quickstart.yml's model (micro-batch 16 of 128 tokens, or
`--seq-length N` with the micro-batch scaled to the same tokens), each variant timed interleaved
with the others in one process on one thread, so a busy machine slows them alike. Prints the
median step time of each variant and its ratio to the unmasked step. Documents end at random
EOD tokens, one every ~64 or ~16 tokens.

    python tools/bench_document_mask.py [--reps 15] [--backend sdpa] [--seq-length 1024]
    python tools/bench_document_mask.py --device cuda --dtype bfloat16 --backend triton --seq-length 4096 --out doc.md
    python tools/bench_document_mask.py --chunks 32,64,128,256 --seq-length 1024

`--chunks`: instead, one SDPA attention call (forward + backward, the quickstart's 4 heads of 64,
KERPLE-log) over documents of ~64 tokens at each DOCUMENT_QUERY_CHUNK (megatron/attention/sdpa.py),
chunked whatever DOCUMENT_CHUNKED_SHARE says, interleaved: how the chunk size was chosen.
"""
from __future__ import annotations

import argparse
import statistics
import time

EOD = 0


def packed_tokens(batch: int, length: int, mean_doc: int | None, vocab: int, seed: int):
    """(batch, length) random tokens with an EOD ending a document every ~mean_doc tokens (None: no EOD)."""
    import torch  # lazy: --help answers without torch (tests/unit/test_lazy_imports.py)

    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, vocab, (batch, length), generator=g)
    if mean_doc is not None:
        tokens[torch.rand(batch, length, generator=g) < 1.0 / mean_doc] = EOD
    return tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--backend", nargs="+", default=["sdpa"], help="one table per backend")
    p.add_argument("--config", default="configs/quickstart.yml")
    p.add_argument("--seq-length", type=int, default=None, help="default: the config's; the micro-batch keeps "
                   "the config's tokens per micro-batch")
    p.add_argument("--chunks", default=None, help="comma-separated SDPA document chunk sizes to time instead")
    p.add_argument("--device", default="cpu", help="cpu (one thread) or cuda (timed with a synchronize each step)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="the model's dtype")
    p.add_argument("--out", default=None, help="also append the table to this markdown file (the GPU check's)")
    args = p.parse_args()
    if args.chunks:
        time_chunks([int(c) for c in args.chunks.split(",")], args.seq_length or 128, args.reps)
        return
    for backend in args.backend:
        time_steps(args, backend)


def time_steps(args, backend: str) -> None:
    """One backend's table: the unmasked step against packed documents of ~64 and ~16 tokens."""
    # lazy: --help answers without torch (tests/unit/test_lazy_imports.py)
    import torch

    from megatron.attention.documents import PackedDocuments
    from megatron.config import load_config
    from megatron.data.position_recipes import document_starts
    from megatron.model import GPTModel

    torch.set_num_threads(1)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    over = {"attention-backend": backend, "padded-vocab-size": 8192}
    if args.seq_length:
        over.update({"seq-length": args.seq_length, "max-position-embeddings": args.seq_length})
    cfg = load_config([args.config], overrides=over)
    m = cfg.model
    torch.manual_seed(0)
    model = GPTModel(m, 8192).to(device=device, dtype=dtype).train()
    tokens_per_micro = 16 * 128 if args.seq_length else None
    B = max(1, tokens_per_micro // m.seq_length) if tokens_per_micro else cfg.training.train_micro_batch_size_per_gpu
    L = m.seq_length
    variants = {"unmasked": None, "documents ~64 tokens": 64, "documents ~16 tokens": 16}
    batches = {}
    for name, mean in variants.items():
        tokens = packed_tokens(B, L + 1, mean, 8192, seed=1).to(device)
        docs = None if mean is None else PackedDocuments(document_starts(tokens[:, :-1], EOD), True)
        batches[name] = (tokens[:, :-1], tokens[:, 1:], docs)
    times = {name: [] for name in variants}

    def step(name):
        tokens, labels, docs = batches[name]
        model.zero_grad(set_to_none=True)
        sync()
        start = time.perf_counter()
        model(tokens, labels=labels, documents=docs).backward()
        sync()
        return time.perf_counter() - start

    for name in variants:  # warm-up
        step(name)
    for _ in range(args.reps):
        for name in variants:  # interleaved
            times[name].append(step(name))
    base = statistics.median(times["unmasked"])
    where = "1 thread" if device.type == "cpu" else torch.cuda.get_device_name(device)
    lines = [f"{m.num_layers} layers, hidden {m.hidden_size}, {m.num_attention_heads} heads, pos-emb {m.pos_emb}, "
             f"backend {backend}, micro-batch {B} x {L} tokens, {args.dtype}, {where}, {args.reps} interleaved reps",
             "", "| variant | median step (ms) | ratio to unmasked |", "|---|---|---|"]
    for name in variants:
        med = statistics.median(times[name])
        lines.append(f"| {name} | {med * 1000:.1f} | {med / base:.3f} |")
    print("\n".join(lines))
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n".join(lines) + "\n\n")


def time_chunks(sizes: list[int], length: int, reps: int) -> None:
    """The `--chunks` table (module docstring)."""
    # lazy: --help answers without torch (tests/unit/test_lazy_imports.py)
    import torch

    from megatron.attention import resolve_backend, sdpa
    from megatron.attention.documents import PackedDocuments
    from megatron.data.position_recipes import document_starts
    from megatron.positional.base import PositionalSpec
    from megatron.positional.distance import position_run
    from megatron.positional.registry import build_scheme

    torch.set_num_threads(1)
    batch = max(1, 16 * 128 // length)
    scheme = build_scheme("kerple_log", PositionalSpec(num_heads=4, head_dim=64, hidden_size=256,
                                                       max_position_embeddings=length, options={}))
    docs = PackedDocuments(document_starts(packed_tokens(batch, length, 64, 8192, seed=1), EOD), True)
    q, k, v = (torch.randn(batch, 4, length, 64, requires_grad=True) for _ in range(3))
    backend = resolve_backend("sdpa", scheme, torch.device("cpu"), torch.float32, True, documents=True)
    pos = position_run(0, length, torch.device("cpu"))
    share, times = sdpa.DOCUMENT_CHUNKED_SHARE, {size: [] for size in sizes}
    sdpa.DOCUMENT_CHUNKED_SHARE = 1.0  # always chunked: the sizes are what is compared
    try:
        for rep in range(reps + 1):
            for size in sizes:  # interleaved; the first round is a warm-up
                sdpa.DOCUMENT_QUERY_CHUNK = size
                start = time.perf_counter()
                backend.forward(q, k, v, scheme, pos, pos, documents=docs).sum().backward()
                if rep:
                    times[size].append(time.perf_counter() - start)
    finally:
        sdpa.DOCUMENT_CHUNKED_SHARE = share
    print(f"SDPA attention fwd+bwd, kerple_log, {batch} x {length} tokens, 4 heads of 64, documents ~64 tokens, "
          f"fp32, 1 thread, {reps} interleaved reps")
    print("| DOCUMENT_QUERY_CHUNK | median (ms) |")
    print("|---|---|")
    for size in sizes:
        print(f"| {size} | {statistics.median(times[size]) * 1000:.1f} |")
