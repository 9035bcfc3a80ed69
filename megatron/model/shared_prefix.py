"""Attention of a fork's rows over their shared past, reading the past once.

A kv-cache forked n ways (KVCache.repeat_rows: retrieval's K candidates on one haystack,
megatron/evaluation/retrieval/scoring.py) holds the B prompts' past once. The n rows forked from
prompt b each add a few tokens of their own. Reading them the plain way gives every row its own
copy of the past in every layer (the cache's append) and the backend another (SDPA's CPU route
reverses the keys): n copies of L_past keys, which cost more than the attention itself
(docs/benchmarks.md, "Retrieval at length").

Here the n rows' queries are folded into one query axis against the one copy of the past (they
sit at the same positions, so the scheme's bias over the past is the same for each), and each row
also attends to its own new keys; one softmax over both, so the result is the plain path's up to
rounding. Scores are q.k / sqrt(D) plus the scheme's bias, masked by the causal (and window) rule
(megatron/attention/mask.py allowed_mask), in float32: the reference backend's arithmetic.

The first forward on a fork only, and only where that arithmetic is the whole of the scheme: no
multiplicative score weight, no late rotation (xPos), no padded rows; anything else takes the plain
path (LayerCache.update materialises the fork).
"""
from __future__ import annotations

import math

import torch

from megatron.attention.mask import allowed_mask


def shared_prefix_applies(ctx, late: bool) -> bool:
    """Whether this forward's attention may read a fork's past once (module docstring)."""
    return (ctx.cache is not None and not late and ctx.row_starts is None
            and not ctx.scheme.has_score_weight and ctx.cache.shared_prefix() is not None)


def _scores(q: torch.Tensor, k: torch.Tensor, scheme, q_pos: torch.Tensor, k_pos: torch.Tensor,
            window: int | None) -> torch.Tensor:
    """float32 q.k/sqrt(D) + bias, -inf where not allowed: q (..., H, Lq, D), k (..., H, Lk, D)."""
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    bias = scheme.score_bias(q_pos, k_pos)  # (H, Lq, Lk) or None
    if bias is not None:
        scores = scores + bias.float()
    return scores.masked_fill(~allowed_mask(q_pos, k_pos, window), float("-inf"))


def shared_prefix_attention(q: torch.Tensor, k_own: torch.Tensor, v_own: torch.Tensor, prefix, ctx) -> torch.Tensor:
    """q (B*n, H, w, D) of the fork's rows at positions ctx.q_pos; k_own, v_own (B*n, H_kv, w, D) their
    own new keys; prefix: the layer's SharedPrefix (past (B, H_kv, L_past, D)). Returns (B*n, H, w, D)."""
    n, (Bn, H, w, D) = prefix.n, q.shape
    B, G, Lp = prefix.k.shape[0], prefix.k.shape[1], prefix.k.shape[2]
    group = H // G  # grouped-query heads: query head h reads kv head h // group
    k_past, v_past = (t.repeat_interleave(group, dim=1) if group > 1 else t for t in (prefix.k, prefix.v))
    k_own, v_own = (t.repeat_interleave(group, dim=1) if group > 1 else t for t in (k_own, v_own))
    past_pos, own_pos = ctx.k_pos[:Lp], ctx.q_pos
    # the n rows of a prompt share one query axis against its one past: (B, H, n * w, D)
    q_fold = q.view(B, n, H, w, D).transpose(1, 2).reshape(B, H, n * w, D)
    past = _scores(q_fold, k_past, ctx.scheme, own_pos.repeat(n), past_pos, ctx.window)  # (B, H, n*w, Lp)
    own = _scores(q, k_own, ctx.scheme, own_pos, own_pos, ctx.window)  # (B*n, H, w, w)
    own = own.view(B, n, H, w, w).transpose(1, 2)  # (B, H, n, w, w)
    probs = torch.softmax(torch.cat([past.view(B, H, n, w, Lp), own], dim=-1), dim=-1)
    out = torch.matmul(probs[..., :Lp].reshape(B, H, n * w, Lp), v_past.float()).view(B, H, n, w, D)
    out = out + torch.matmul(probs[..., Lp:], v_own.float().view(B, n, H, w, D).transpose(1, 2))
    return out.transpose(1, 2).reshape(Bn, H, w, D).to(q.dtype)
