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

from megatron.attention.base import partitioned
from megatron.attention.mask import consecutive_starts, query_blocks, row_positions
from megatron.attention.resolve import long_cpu_inference, resolve_backend
from megatron.model.shared_prefix import shared_prefix_applies, shared_prefix_attention
from megatron.positional.distance import is_sampled, run_slice
from megatron.positional.logn import scale_queries


def cached_backend(backends: dict, model_cfg, scheme: nn.Module, device: torch.device, dtype: torch.dtype,
                   training: bool, tokens: int | None = None, padded: bool = False, documents: bool = False,
                   sampled: bool = False):
    """The attention backend for this (device, dtype, mode), resolved once into `backends` (a
    model's own dict: GPTModel and GPTPipe keep one, a pipeline layer called on its own too). `tokens`: the full-sequence
    length (no kv-cache), which "auto" consults for long CPU inference only. `padded`: a batch
    with left-padded rows (not every backend takes them). `documents`, `sampled`: packed documents,
    positions a training recipe drew (megatron/attention/resolve.py)."""
    long = long_cpu_inference(device, training, tokens)
    key = (device.type, dtype, training, long, padded, documents, sampled)
    if key not in backends:
        backends[key] = resolve_backend(model_cfg.attention_backend, scheme, device, dtype, training,
                                        dropout=training and model_cfg.attention_dropout > 0,
                                        tokens=tokens if long else None, padded=padded, documents=documents,
                                        sampled=sampled)
    return backends[key]


@dataclass
class AttentionContext:
    """Per-forward state shared by all layers: GPTModel builds it once per forward, GPTPipe once per
    forward of its stage (AttentionContext.build for both)."""

    scheme: nn.Module  # the shared PositionalScheme instance
    backend: object  # an AttentionBackend from megatron.attention
    q_pos: torch.Tensor  # (Lq,) absolute positions of the queries; (B, Lq): each row its own (drawn)
    k_pos: torch.Tensor  # (Lk,) absolute positions of the keys; (B, Lk) likewise
    window: int | None = None  # attend to keys i-W < j <= i
    softmax_in_fp32: bool = False
    dropout_p: float = 0.0
    # Attention-probability dropout acts on this rank's heads only, so under TP it draws from the
    # per-rank stream (GPTModel.sharding.dropout_rng); without TP it is a no-op context.
    dropout_rng: Callable = contextlib.nullcontext
    # Incremental decoding: this layer's megatron.model.kv_cache.LayerCache, or None. With a
    # cache, q_pos are the new tokens' positions and k_pos = past positions + q_pos.
    cache: object | None = None
    # The backend's prepare(scheme, q_pos, k_pos, window): a shared scheme's [H, Lq, Lk] bias,
    # SDPA's float mask, flex's block mask..., built once for every layer of this forward.
    prepared: object | None = None
    # (Lq,) per-query multipliers of q.k/sqrt(d) (log-n scaling: scheme.query_scale), or None;
    # (B, Lq) for padded rows.
    q_scale: torch.Tensor | None = None
    # (B,) first real position of each row of a left-padded batch (megatron/attention/mask.py), or None.
    row_starts: torch.Tensor | None = None
    # Packed documents (megatron/attention/documents.py), or None: one sequence per row.
    documents: object | None = None

    @classmethod
    def build(cls, model_cfg, scheme: nn.Module, backends: dict, device: torch.device, dtype: torch.dtype,
              training: bool, q_pos: torch.Tensor, k_pos: torch.Tensor | None = None,
              row_starts: torch.Tensor | None = None, documents=None) -> AttentionContext:
        """The context for the layers' hidden states (on `device`, of `dtype`) at positions q_pos
        (keys: k_pos, default q_pos), with the backend resolved once per (device, dtype, mode)
        into `backends`.
        `row_starts`: each row's first real position in a left-padded batch, or None.
        `documents`: packed documents (training), or None.

        Build it OUTSIDE activation-checkpointed regions when layers share it: the prepared
        tensors are then inputs of every layer (one autograd node, gradient summed over layers),
        and a layer's recomputation finds exactly the ops its first forward ran."""
        # A full sequence (queries = keys = one consecutive run, no kv-cache) tells "auto" its length.
        full = k_pos is None and long_cpu_inference(device, training, q_pos.shape[-1]) and (
            consecutive_starts(q_pos, q_pos) is not None)
        # Rows at their own positions ((B, L)) are drawn positions whether marked or not: only the
        # backends that take drawn positions read them per row.
        backend = cached_backend(backends, model_cfg, scheme, device, dtype, training,
                                 tokens=q_pos.shape[-1] if full else None, padded=row_starts is not None,
                                 documents=documents is not None, sampled=is_sampled(q_pos) or q_pos.dim() == 2)
        k_pos = q_pos if k_pos is None else k_pos
        window = model_cfg.attention_window
        prepared = (backend.prepare(scheme, q_pos, k_pos, window, row_starts, documents)
                    if shares_prepared(scheme, backend) else None)
        own = documents.within_positions() if documents is not None else None  # reset-position-ids
        q_scale = scheme.query_scale(row_positions(q_pos, row_starts) if own is None else own, window)
        return cls(scheme=scheme, backend=backend, q_pos=q_pos, k_pos=k_pos, window=window,
                   softmax_in_fp32=model_cfg.attention_softmax_in_fp32, dropout_p=model_cfg.attention_dropout,
                   prepared=prepared, q_scale=q_scale, row_starts=row_starts, documents=documents)


def shares_prepared(scheme: nn.Module, backend) -> bool:
    """Whether the layers of one forward share one prepared state. Always for a backend whose
    prepared state holds no bias built from the scheme's parameters (flash's layout check, flex's
    block mask and clamped per-head parameters; triton's positions and the per-head parameters,
    whose gradients it then reduces once over all layers: megatron/attention/kernels/attention.py
    ForwardGradients): each layer preparing its own costs a host sync per layer (and per
    recomputed layer). For a backend that prepares a bias (sdpa, reference): always, except when
    autograd records the scheme's learnable parameters (training KERPLE). There each layer prepares its own,
    as before: sharing would sum the layers' [H, Lq, Lk] bias gradients BEFORE the reduction to
    the per-head parameters instead of after it, the same gradient up to rounding (measured: max
    difference 4e-9 on the quickstart model) but not the same bits, and training figures (the
    quickstart table) must stay bit-identical. Evaluation (no_grad), fixed biases (alibi) and
    plain schemes share: bitwise the same logits and gradients.

    Never under ZeRO-3 (parameters carry `ds_id`): the scheme's partitioned parameters are gathered
    only inside the layers' forward, so a bias prepared outside them would have no heads."""
    if not backend.prepares_from_parameters:
        return True
    if partitioned(scheme):
        return False
    return not (torch.is_grad_enabled() and any(p.requires_grad for p in scheme.parameters()))


class SelfAttention(nn.Module):
    def __init__(self, model_cfg, init_method, output_init_method):
        super().__init__()
        h, heads = model_cfg.hidden_size, model_cfg.num_attention_heads
        self.num_heads = heads  # the heads this module computes (a tensor-parallel shard: its own)
        self.num_kv_heads = model_cfg.kv_heads  # key/value heads, likewise
        self.head_dim = h // heads
        self.grouped = model_cfg.grouped_query
        kv = model_cfg.kv_heads * self.head_dim
        # Multi-head: rows laid out per head as [q_h | k_h | v_h] (NeoX), so a contiguous split
        # across tensor-parallel ranks gives each rank whole heads. Grouped-query (NeoX's gqa):
        # rows [Q | K | V] (`qkv_groups`), each group split over the ranks on its own.
        self.qkv_groups = (h, kv, kv) if self.grouped else None
        self.query_key_value = nn.Linear(h, h + 2 * kv, bias=model_cfg.use_bias_in_attn_linear)
        self.dense = nn.Linear(h, h, bias=model_cfg.use_bias_in_attn_linear)
        init_method(self.query_key_value.weight)
        output_init_method(self.dense.weight)
        for lin in (self.query_key_value, self.dense):
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, L, h) -> q (B, H, L, D), k and v (B, H_kv, L, D) on this rank."""
        B, L, _ = x.shape
        qkv = self.query_key_value(x)
        if not self.grouped:
            q, k, v = qkv.view(B, L, self.num_heads, 3 * self.head_dim).transpose(1, 2).chunk(3, dim=-1)
            return q, k, v
        D, H, G = self.head_dim, self.num_heads, self.num_kv_heads
        q, k, v = qkv.split([H * D, G * D, G * D], dim=-1)
        return (q.view(B, L, H, D).transpose(1, 2), k.view(B, L, G, D).transpose(1, 2),
                v.view(B, L, G, D).transpose(1, 2))

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        B, L, _ = x.shape
        q, k, v = self.project(x)  # q (B, H, L, D); k, v (B, H_kv, L, D)
        # With a cache, k holds only the new tokens (positions q_pos); cached keys are already
        # rotated, so rotary sees each key once, at its own absolute position. A scheme whose
        # rotation depends on the whole call (rotate_after_cache: xPos) caches raw keys and is
        # rotated in _attend, per query block.
        late = ctx.scheme.rotate_after_cache
        if not late:
            q, k = ctx.scheme.rotate_qk(q, k, ctx.q_pos, ctx.q_pos if ctx.cache is not None else ctx.k_pos)
        # Log-n scaling multiplies query rows (a per-row scalar: it commutes with any rotation),
        # so every backend computes s_i * q.k / sqrt(D).
        q = scale_queries(q, ctx.q_scale)
        if shared_prefix_applies(ctx, late):  # a fork's rows read their shared past once (shared_prefix.py)
            prefix = ctx.cache.shared_prefix()
            ctx.cache.append_own(k, v)
            out = shared_prefix_attention(q, k, v, prefix, ctx)
            return self.dense(out.transpose(1, 2).reshape(B, L, -1))
        if ctx.cache is not None:
            k, v = ctx.cache.update(k, v)  # (B, H_kv, L_kept + L, D): the cache holds the kv heads only
        # Grouped-query k, v stay (B, H_kv, ...): the backend maps query head i to kv head
        # i // (H / H_kv), as NeoX and HF's repeat_kv, without a copy per query head where its
        # kernel allows (megatron/attention/base.py).
        with ctx.dropout_rng(x.device):
            out = self._attend(q, k, v, ctx, late)  # (B, H_local, L, D)
        return self.dense(out.transpose(1, 2).reshape(B, L, -1))

    def _attend(self, q, k, v, ctx: AttentionContext, late: bool) -> torch.Tensor:
        """The backend over all queries; for a late-rotated scheme, in the query blocks its
        rotation holds (xPos: finite factors, mask.query_blocks), each rotated with its own centre
        and seeing the keys up to its last query. One block is the unblocked call."""
        span = ctx.scheme.max_query_span(q.dtype) if late else None
        blocks = query_blocks(ctx.q_pos, ctx.k_pos, span)
        if ctx.documents is not None and len(blocks) > 1:  # the documents describe the whole row's queries
            raise ValueError(f"packed documents (reset-attention-mask) take the row's {ctx.q_pos.shape[-1]} queries in one "
                             f"call, and pos-emb {ctx.scheme.name!r} rotates at most {span} per call in "
                             f"{str(q.dtype).removeprefix('torch.')}; use seq-length <= {span} or turn the document keys off")
        outs = []
        for rows, keys in blocks:
            q_pos, k_pos = run_slice(ctx.q_pos, rows), run_slice(ctx.k_pos, keys)
            qb, kb, vb = q[:, :, rows], k[:, :, keys], v[:, :, keys]
            if late:
                qb, kb = ctx.scheme.rotate_qk(qb, kb, q_pos, k_pos)
            prepared = ctx.prepared
            if prepared is not None and rows != slice(None):  # the shared one is for the whole call
                prepared = ctx.backend.prepare(ctx.scheme, q_pos, k_pos, ctx.window, ctx.row_starts, ctx.documents)
            outs.append(ctx.backend.forward(
                qb, kb, vb, ctx.scheme, q_pos, k_pos,
                window=ctx.window,
                softmax_in_fp32=ctx.softmax_in_fp32,
                dropout_p=ctx.dropout_p if self.training else 0.0,
                prepared=prepared,
                row_starts=ctx.row_starts,
                documents=ctx.documents,
            ))  # (B, H_local, L_block, D); kb, vb: (B, H_kv_local, L_keys, D)
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
