"""Perplexity on equal text: every length scores the SAME tokens, only the context before them
changes.

The per-length sweep (lengths.py) scores each length on its own windows, so two lengths compare
different text: the 32x windows of a corpus can simply be easier than the 1x ones (in the KERPLE
study's records, the first 64 positions of KERPLE-log's 32x windows, scored with the same short
context as at 1x, were already 19.5% (code) and 9.7% (LaTeX) below the 1x perplexity). Here the
split's document stream (the same seeded order as the sweep) is cut at `spans` end points
e_i = longest + i * scored, and at every length L the window stream[e_i - L : e_i + 1] is read (L
inputs, the last target e_i) and only its last `scored` targets (e_i - scored + 1 .. e_i) are scored. So
at L = scored (1x) a scored token sees 0 .. scored-1 tokens of context, at L = 32x 31x .. 32x of
them, and every difference between lengths is the context's doing.
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch

from megatron.evaluation.lengths import check_finite_losses
from megatron.evaluation.spread import ONE_PROCESS, EvalGroup
from megatron.evaluation.strided import stream_tokens


def span_ends(spans: int, longest: int, scored: int) -> list[int]:
    """The end point (last target's index in the stream) of each scored span: far enough in that
    the longest length has its whole context, consecutive spans disjoint."""
    return [longest + i * scored for i in range(spans)]


@torch.no_grad()
def evaluate_equal_text(model, data_prefix, split, split_name, lengths: list[int], scored: int, spans: int,
                        seed: int, device="cpu", cache_dir=None, group: EvalGroup = ONE_PROCESS) -> dict:
    """{str(length): {"loss", "ppl", "tokens", "spans", "seconds"}} over the same scored tokens at every
    length, plus "scored_tokens_per_span" and "spans" (module docstring); ranks share the spans."""
    longest = max(lengths)
    if min(lengths) < scored:
        raise ValueError(f"equal-text scoring reads the last {scored} targets of every window: lengths "
                         f"{[x for x in lengths if x < scored]} are shorter")
    ends = span_ends(spans, longest, scored)
    out: dict = {"spans": spans, "scored_tokens_per_span": scored, "context_before_scored": {}}
    for length in lengths:
        start_time = time.perf_counter()

        def score(length=length) -> tuple[np.ndarray, int]:  # this rank's spans
            tokens = torch.from_numpy(stream_tokens(data_prefix, split, split_name, seed, ends[-1], cache_dir,
                                                    getattr(model, "vocab_size", None)).astype(np.int64))
            if tokens.numel() < ends[-1] + 1:
                raise ValueError(f"the {split_name} split holds {tokens.numel()} tokens, fewer than the "
                                 f"{ends[-1] + 1} that {spans} equal-text spans after a {longest}-token context need: "
                                 "lower --equal-text or the longest length")
            part = group.part(len(ends))
            total = 0.0
            for i in part:
                e = ends[i]
                inp = tokens[e - length:e].unsqueeze(0).to(device)  # the window's L inputs
                lab = tokens[e - length + 1:e + 1].unsqueeze(0).to(device)  # its targets, the last one e
                losses = model.token_losses(inp, lab)[0, -scored:]
                check_finite_losses(model, losses, length, f"equal-text span {i + 1} of {len(ends)}",
                                    offset=length - scored)
                total += float(losses.double().sum())
            return np.array([total], dtype=np.float64), len(part)

        (total,), _ = group.sum_parts(score)
        loss = total / (spans * scored)
        out[str(length)] = {"loss": loss, "ppl": math.exp(min(loss, 700.0)), "tokens": spans * scored,
                            "seconds": round(time.perf_counter() - start_time, 3)}
        out["context_before_scored"][str(length)] = [length - scored, length - 1]
    return out
