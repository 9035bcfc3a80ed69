"""The reference backend: materialised scores, read top to bottom, any scheme, device and dtype.

It mirrors the paper's attention (K transformer.py): scores = baddbmm(q, k^T, alpha=1/sqrt(D)) in
the input dtype, then the scheme's weight and bias, then masked_fill(finfo.min), softmax,
dropout, @ v. Memory is O(B * H * Lq * Lk): slow but the yardstick every other backend is
tested against. Grouped-query k/v are repeated to every query head here (repeat_kv), the plainest
reading of the grouping; the other backends map the heads without that copy."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from megatron.attention.base import AttentionBackend, kv_group, repeat_kv
from megatron.attention.mask import allowed_mask
from megatron.attention.registry import register_backend
from megatron.positional.distance import run_start


def scaled_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """(q @ k^T) / sqrt(D) as one baddbmm like Megatron, in the input dtype: (B, H, Lq, Lk)."""
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    q3 = q.reshape(B * H, Lq, D)
    k3 = k.reshape(B * H, Lk, D)
    out = torch.empty(B * H, Lq, Lk, dtype=q.dtype, device=q.device)
    out = torch.baddbmm(out, q3, k3.transpose(1, 2), beta=0.0, alpha=1.0 / math.sqrt(D))
    return out.view(B, H, Lq, Lk)


@dataclass(frozen=True)
class ReferencePrepared:
    weight: torch.Tensor | None  # (H, Lq, Lk) fp32 score weight, or None ((B, H, Lq, Lk): padded rows
    bias: torch.Tensor | None  # (H, Lq, Lk) fp32 score bias, or None     of a position-dependent scheme)
    allowed: torch.Tensor  # (Lq, Lk) bool; (B, 1, Lq, Lk) with padded rows or packed documents


@register_backend("reference", priority=1000)
class ReferenceAttention(AttentionBackend):
    def prepare(self, scheme, q_pos, k_pos, window=None, row_starts=None, documents=None):
        # The scheme computes in fp32; like the paper, forward casts to the scores' dtype.
        doc_starts = None if documents is None else documents.starts
        allowed = allowed_mask(q_pos, k_pos, window, row_starts, doc_starts)  # (Lq, Lk) or (B, 1, Lq, Lk)
        # The diagonal is always allowed under a causal mask, so a query whose own position is a
        # key has a key (no 0/0): known on the host when the keys' run covers the queries' run;
        # otherwise read from the mask.
        q0, k0 = run_start(q_pos), run_start(k_pos)
        if q0 is None or k0 is None or not (k0 <= q0 and q0 + q_pos.numel() <= k0 + k_pos.numel()):
            assert bool(allowed.any(dim=-1).all()), "a query row has no allowed key"
        own = None if documents is None else documents.within_positions()  # (B, L) or None
        own = None if own is None else (own, own)  # the queries' and keys' (the same tokens)
        return ReferencePrepared(scheme.batch_score_weight(q_pos, k_pos, row_starts, own),
                                 scheme.batch_score_bias(q_pos, k_pos, row_starts, own), allowed)

    def forward(self, q, k, v, scheme, q_pos, k_pos, window=None, softmax_in_fp32=False,
                dropout_p=0.0, prepared=None, row_starts=None, documents=None):
        prepared = prepared or self.prepare(scheme, q_pos, k_pos, window, row_starts, documents)
        group = kv_group(q, k)
        k, v = repeat_kv(k, group), repeat_kv(v, group)  # autograd sums dk, dv over each group
        scores = scaled_scores(q, k)  # (B, H, Lq, Lk), input dtype
        if softmax_in_fp32:
            # Upcast before the bias so the kernel values are not rounded to bf16 first.
            scores = scores.float()
        if prepared.weight is not None:
            scores = scores * prepared.weight.to(scores.dtype)
        if prepared.bias is not None:
            scores = scores + prepared.bias.to(scores.dtype)
        scores = scores.masked_fill(~prepared.allowed, torch.finfo(scores.dtype).min)
        probs = F.softmax(scores, dim=-1).to(v.dtype)  # (B, H, Lq, Lk)
        if dropout_p > 0.0:
            probs = F.dropout(probs, p=dropout_p, training=True)
        return probs @ v  # (B, H, Lq, D)
