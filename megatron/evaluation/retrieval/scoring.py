"""Scoring retrieval prompts: multiple choice by likelihood and greedy generation, both from ONE
forward over the haystack.

The prompt (B rows of L tokens, no padding: every prompt of a length has exactly L tokens) is
read once into a kv-cache. Its last position's distribution gives every candidate's first token.
For the rest, the cache is forked to K rows per prompt (`KVCache.repeat_rows`) and the K
candidates' remaining tokens are read on top of it, the haystack's keys read once for all K
(megatron/model/shared_prefix.py): K candidates cost 1.04x one forward at 2,048 tokens, not K
(tools/bench_retrieval.py, docs/benchmarks.md). The candidate
with the highest total log-probability (float32 log-softmax over the whole vocabulary, as the
training loss) is the model's choice. Greedy generation continues the original cache one token
at a time for as many tokens as the answer has, and is right when it spells the answer exactly.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from megatron.evaluation.lengths import NonFiniteLoss
from megatron.generation import decode


@dataclass(frozen=True)
class Scored:
    logprobs: list[float]  # per candidate, the sum over its tokens
    choice: int  # the candidate of highest log-probability
    generated: list[int] | None  # greedy tokens (as many as the answer has), or None when not asked


def _logprobs(model, hidden: torch.Tensor) -> torch.Tensor:
    """Final hidden states (..., h) -> float32 log-probabilities (..., V)."""
    return torch.log_softmax(model.logits(hidden).float(), dim=-1)


def _finite(hidden: torch.Tensor, length: int) -> None:
    if not bool(torch.isfinite(hidden).all()):
        raise NonFiniteLoss(f"the model's outputs are not finite on retrieval prompts of {length} tokens: its "
                            "computation overflows at this length and the scores would be meaningless; drop "
                            "the length")


@torch.no_grad()
def score_prompts(model, prompts: list, device, generate: bool = True) -> list[Scored]:
    """Score prompts of one length (module docstring); every candidate of a prompt has the same
    number of tokens, and the batch is split where that number changes."""
    out: list[Scored | None] = [None] * len(prompts)
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(len(p.candidates[0]), []).append(i)
    for width, members in groups.items():
        for i, scored in zip(members, _score_group(model, [prompts[i] for i in members], width, device, generate)):
            out[i] = scored
    return out


def _score_group(model, prompts: list, width: int, device, generate: bool) -> list[Scored]:
    B, K, L = len(prompts), len(prompts[0].candidates), len(prompts[0].tokens)
    tokens = torch.tensor([p.tokens for p in prompts], dtype=torch.long, device=device)  # (B, L)
    cands = torch.tensor([p.candidates for p in prompts], dtype=torch.long, device=device)  # (B, K, width)
    cache = model.new_cache()
    last = model.hidden_states(tokens, cache=cache)[:, -1:]  # (B, 1, h): only the last row is needed
    _finite(last, L)
    first = _logprobs(model, last)[:, 0]  # (B, V)
    total = first.gather(1, cands[:, :, 0])  # (B, K)
    if width > 1:  # the candidates' other tokens, K rows per prompt on a fork of the cache
        fork = cache.repeat_rows(K)
        hidden = model.hidden_states(cands[:, :, :-1].reshape(B * K, width - 1), cache=fork)  # (B*K, w-1, h)
        _finite(hidden, L)
        rest = _logprobs(model, hidden).gather(-1, cands.reshape(B * K, width)[:, 1:, None])[..., 0]
        total = total + rest.reshape(B, K, width - 1).sum(-1)
    generated = _greedy(model, cache, first, width) if generate else None
    logprobs = total.tolist()
    return [Scored(lp, max(range(K), key=lambda k, lp=lp: lp[k]), None if generated is None else generated[b])
            for b, lp in enumerate(logprobs)]


def _greedy(model, cache, first: torch.Tensor, n: int) -> list[list[int]]:
    """`n` greedy tokens per row, continuing `cache` (the prompt's) from its next-token log-probs."""
    forward = lambda step: _logprobs(model, model.hidden_states(step, cache=cache))[:, -1]
    steps = decode(first, forward, lambda logprobs: logprobs.argmax(-1))
    return torch.stack([next(steps) for _ in range(n)], dim=1).tolist()
