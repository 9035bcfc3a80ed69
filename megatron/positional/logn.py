"""Entropy-invariant log-n attention scaling (Su Jianlin, "Understanding Attention's Scale Operation
from Entropy Invariance", kexue.fm/archives/8823; Qwen's `use_logn_attn`): query i's scaled scores
q.k / sqrt(D) are multiplied by

    s_i = log(n_i) / log(L_train)                 (`attention-logn-everywhere: true`, Su's article)
    s_i = max(1, log(n_i) / log(L_train))         (default, Qwen's logn-attn: only past L_train)

where n_i is the number of keys query i sees, i + 1 at absolute position i (min(i + 1, W) with
`attention-window: W`; with a kv-cache i is the absolute position, so decoding scales as the full
sequence does), and L_train = `seq-length`. Su derives it so the attention entropy stays what it
was at the training length as n grows; with the default, training (n <= L_train) is unchanged.

The factor multiplies q.k / sqrt(D) before the positional weight and bias are applied:
scores = s_i * q.k / sqrt(D) * weight + bias. As in Qwen, it is applied by scaling the query rows
(q_i <- s_i * q_i) before the attention backend, which is the same product for every backend
(reference, SDPA, flex, flash, the Triton kernel) and for the kv-cache, with no backend change."""
from __future__ import annotations

import math

import torch


def logn_scale(q_pos: torch.Tensor, train_length: int, window: int | None = None,
               everywhere: bool = False) -> torch.Tensor:
    """(Lq,) float32 per-query multipliers for queries at absolute positions q_pos (int64); (B, Lq)
    for padded rows' own positions (megatron/attention/mask.py: row_positions)."""
    if train_length < 2:
        raise ValueError(f"log-n scaling divides by log(seq-length), which needs seq-length >= 2, got {train_length}")
    n = (q_pos.to(torch.float64) + 1).clamp_min(1)  # keys seen by the query at position i: 0..i
    if window is not None:
        n = n.clamp_max(window)
    scale = torch.log(n) / math.log(train_length)
    if not everywhere:
        scale = scale.clamp_min(1.0)
    return scale.float()


def scale_queries(q: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """q (B, H, Lq, D) with row i multiplied by scale[i] (in fp32, then rounded once to q's dtype);
    scale (B, Lq): each batch row its own (padded rows). q itself when scale is None. The model and
    the Hugging Face export both call this."""
    if scale is None:
        return q
    scale = scale.to(q.device)
    scale = scale[:, None] if scale.dim() == 1 else scale[:, None, :, None]  # (Lq, 1) / (B, 1, Lq, 1)
    return (q.float() * scale).to(q.dtype)
