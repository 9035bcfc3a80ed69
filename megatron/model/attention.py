"""Causal self-attention with a pluggable positional scheme and attention backend.

The module never looks at the scheme's name: it calls `scheme.rotate_qk` and hands the scheme to
the backend, which asks it for `score_bias` / `score_weight` (see megatron/positional/base.py).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from megatron.model.linear import column_parallel, row_parallel


@dataclass
class AttentionContext:
    """Per-forward state shared by all layers (built once by GPTModel.forward)."""

    scheme: nn.Module  # the shared PositionalScheme instance
    backend: object  # an AttentionBackend from megatron.attention
    q_pos: torch.Tensor  # (Lq,) absolute positions of the queries
    k_pos: torch.Tensor  # (Lk,) absolute positions of the keys
    window: int | None = None  # attend to keys i-W < j <= i
    softmax_in_fp32: bool = False
    dropout_p: float = 0.0
    # Attention-probability dropout acts on this TP rank's heads only, so under TP it draws from
    # the per-rank stream (ParallelContext.rng.fork); without TP it is a no-op context.
    dropout_rng: Callable = contextlib.nullcontext
    # Incremental decoding: this layer's megatron.model.kv_cache.LayerCache, or None. With a
    # cache, q_pos are the new tokens' positions and k_pos = past positions + q_pos.
    cache: object | None = None


class SelfAttention(nn.Module):
    def __init__(self, mcfg, init_method, output_init_method, par=None):
        super().__init__()
        h, heads = mcfg.hidden_size, mcfg.num_attention_heads
        tp_size = par.tp_size if par is not None else 1
        self.num_heads = heads // tp_size  # this rank's heads
        self.head_dim = h // heads
        # Rows are laid out per head as [q_h | k_h | v_h] (NeoX), so a contiguous split of the
        # rows across tensor-parallel ranks gives each rank whole heads.
        qkv = nn.Linear(h, 3 * h, bias=mcfg.use_bias_in_attn_linear)
        dense = nn.Linear(h, h, bias=mcfg.use_bias_in_attn_linear)
        init_method(qkv.weight)
        output_init_method(dense.weight)
        for lin in (qkv, dense):
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
        # The full layers above are built on every rank (same draws as TP=1), then sharded.
        self.query_key_value = column_parallel(qkv, par)
        self.dense = row_parallel(dense, par)

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        B, L, _ = x.shape
        qkv = self.query_key_value(x).view(B, L, self.num_heads, 3 * self.head_dim)
        q, k, v = qkv.transpose(1, 2).chunk(3, dim=-1)  # each (B, H, L, D)
        # With a cache, k holds only the new tokens (positions q_pos); cached keys are already
        # rotated, so rotary sees each key once, at its own absolute position.
        q, k = ctx.scheme.rotate_qk(q, k, ctx.q_pos, ctx.q_pos if ctx.cache is not None else ctx.k_pos)
        if ctx.cache is not None:
            k, v = ctx.cache.update(k, v)  # (B, H, L_kept + L, D)
        with ctx.dropout_rng(x.device):
            out = ctx.backend.forward(
                q, k, v, ctx.scheme, ctx.q_pos, ctx.k_pos,
                window=ctx.window,
                softmax_in_fp32=ctx.softmax_in_fp32,
                dropout_p=ctx.dropout_p if self.training else 0.0,
            )  # (B, H_local, L, D)
        return self.dense(out.transpose(1, 2).reshape(B, L, -1))
