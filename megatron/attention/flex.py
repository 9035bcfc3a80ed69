"""FlexAttention backend: PyTorch's torch.nn.attention.flex_attention, compiled.

The scheme's bias and weight are evaluated inside the kernel by a `score_mod` built from its
DistanceKernel (megatron/positional/distance_kernel.py), so no [H, Lq, Lk] tensor is ever materialised,
and the causal / window mask is a BlockMask whose fully masked blocks are skipped.

    score' = score * exp(-w_a[h] * d**w_p[h]) + bias(h, d),   d = max(q_pos - k_pos, 0)

(`score` arrives already multiplied by the 1/sqrt(D) scale: the weight-then-bias placement of
base.py.) The per-head tensors captured by score_mod are the scheme's clamped parameters, still
on the autograd graph, and FlexAttention returns gradients for captured tensors, so KERPLE's
parameters train through it. That captured-tensor gradient is accumulated with atomic adds: it
is NOT bit-for-bit deterministic run to run, which is why the triton backend exists.

Where it runs (torch 2.13):
  CUDA  training and inference, via torch.compile(flex_attention) (Triton kernels).
  CPU   inference only: flex_attention raises for inputs that require grad on CPU. What runs
        is the compiled C++ kernel (needs a compiler). Measured on a busy 2-core box: the first
        compile takes 15-25 s with a cold inductor cache (3-5 s warm), each new score_mod or
        dtype ~5 s more; then a call costs about what SDPA does or less (kerple_log, fp32,
        B1 H8 L512 D64: flex 13 ms, sdpa 37 ms, reference 117 ms). "auto" picks it on CPU
        only for schemes SDPA cannot run (a score weight), for inference over full sequences
        of CPU_FLEX_MIN_TOKENS or more (resolve.py). `eager_on_cpu = True` runs
        flex's unfused eager path instead: no compile, but it materialises the scores and
        is ~20-50x slower per call than the compiled kernel.

Grouped-query k/v (B, H_kv, Lk, D) go in as they are with enable_gqa=True: flex maps query head h
to kv head h // (H / H_kv) in its kernel, and score_mod's `h` stays the QUERY head, so the per-head
parameters index as in multi-head attention; the block mask is the same for every head.

Positions must be consecutive runs (q_pos = q0 + arange(Lq), k_pos = k0 + arange(Lk), q0 >= k0,
which training and the kv-cache both produce); the offset q0 - k0 is a captured tensor, so a new
offset or window does not recompile. Packed documents (megatron/attention/documents.py) get a block
mask per batch row from the documents' starts, whose blocks wholly across documents are skipped;
the bias stays a function of i - j, the same within a document from either origin.
"""
from __future__ import annotations

import functools
import math
import shutil
from dataclasses import dataclass

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from megatron.attention.base import AttentionBackend, kv_group, partitioned
from megatron.attention.mask import check_window, consecutive_starts
from megatron.attention.registry import register_backend

# A window wider than any sequence: "no window" shares the windowed mask_mod (no recompile).
_NO_WINDOW = 1 << 62


@functools.cache
def _compiled_flex():
    """One compiled flex_attention per process. torch.compile keeps a graph per score_mod code,
    device, dtype and grad mode (static shapes first, shape-generic once a length changes), up to
    torch._dynamo.config.recompile_limit (8) graphs; past that it warns and runs flex's unfused
    eager path. One model per process stays well inside it."""
    return torch.compile(flex_attention)


LARGE_MASK = 4096 * 4096  # above this many (query, key) pairs the block mask is built compiled


@functools.cache
def _compiled_create_block_mask():
    return torch.compile(create_block_mask)


@functools.lru_cache(maxsize=32)
def _block_mask(lq: int, lk: int, offset: int, window: int | None, device: torch.device):
    """The causal (+ window) BlockMask for query rows q0 + i and keys k0 + j, offset = q0 - k0,
    and the offset as a 0-d device tensor for score_mod. Cached: training reuses one per shape."""
    off = torch.tensor(offset, dtype=torch.int64, device=device)
    width = torch.tensor(_NO_WINDOW if window is None else window, dtype=torch.int64, device=device)

    def mask_mod(b, h, q_idx, kv_idx):
        d = q_idx + off - kv_idx
        return (d >= 0) & (d < width)

    # Eager create_block_mask evaluates mask_mod on the whole [Lq, Lk] grid (int64 distances:
    # 34 GB at 65,536 tokens, measured as an allocation failure); compiled, it works block by
    # block (0.5 GB peak, ~12 s to compile on 2 CPU cores). Short sequences stay eager.
    build = _compiled_create_block_mask() if lq * lk > LARGE_MASK else create_block_mask
    return build(mask_mod, None, None, lq, lk, device=device), off


def _padded_block_mask(lq: int, lk: int, offset: int, window: int | None, first_key: torch.Tensor):
    """The BlockMask of _block_mask with each batch row's padding keys hidden (megatron/attention/
    mask.py): key index j of row b is padding when j < first_key[b], and only its own query sees
    it. Not cached: it depends on the batch's starts."""
    off = torch.tensor(offset, dtype=torch.int64, device=first_key.device)
    width = torch.tensor(_NO_WINDOW if window is None else window, dtype=torch.int64, device=first_key.device)

    def mask_mod(b, h, q_idx, kv_idx):
        d = q_idx + off - kv_idx
        return (d >= 0) & (d < width) & ((kv_idx >= first_key[b]) | (d == 0))

    build = _compiled_create_block_mask() if lq * lk > LARGE_MASK else create_block_mask
    return build(mask_mod, first_key.numel(), None, lq, lk, device=first_key.device), off


def _document_block_mask(length: int, window: int | None, doc_starts: torch.Tensor):
    """The causal (+ window) BlockMask of packed documents (megatron/attention/documents.py): query
    t of row b sees key j only when doc_starts[b, t] <= j. create_block_mask evaluates it block by
    block and drops every block no (query, key) pair of which is allowed, so a tile lying wholly
    across two documents is never computed, not computed and masked. Not cached: it depends on
    the batch's documents."""
    width = torch.tensor(_NO_WINDOW if window is None else window, dtype=torch.int64, device=doc_starts.device)

    def mask_mod(b, h, q_idx, kv_idx):
        d = q_idx - kv_idx
        return (d >= 0) & (d < width) & (kv_idx >= doc_starts[b, q_idx])

    build = _compiled_create_block_mask() if length * length > LARGE_MASK else create_block_mask
    return build(mask_mod, doc_starts.shape[0], None, length, length, device=doc_starts.device)


def _score_mod(kernel, off: torch.Tensor):
    """score_mod evaluating `kernel` (a DistanceKernel) at d = q_idx + off - kv_idx, clamped at 0,
    through the kernel's own closed forms (bias_at / weight_at with a head index): the formula is
    written once, in megatron/positional/distance_kernel.py. Its Python branches are resolved at
    trace time, so each scheme gets a specialised kernel."""

    def score_mod(score, b, h, q_idx, kv_idx):
        d = (q_idx + off - kv_idx).clamp_min(0).to(torch.float32)  # 0 on the masked triangle
        out = score
        weight = kernel.weight_at(d, h)
        if weight is not None:
            out = out * weight
        bias = kernel.bias_at(d, h)
        if bias is not None:
            out = out + bias
        # No cast back to score.dtype: the kernel computes scores in fp32 anyway, and with bf16
        # inputs torch 2.13's compiled CPU kernel miscomputes a score_mod that ends in one.
        return out

    return score_mod


def _consecutive_offset(q_pos: torch.Tensor, k_pos: torch.Tensor) -> int:
    """q0 - k0 when q_pos and k_pos are consecutive runs with q0 >= k0 (one host sync)."""
    starts = consecutive_starts(q_pos, k_pos)
    if starts is None:
        raise ValueError("the flex backend needs consecutive positions (q_pos = q0 + arange(Lq), "
                         "k_pos = k0 + arange(Lk)); use the sdpa or reference backend for gapped positions")
    q0, k0 = starts
    if q0 < k0:
        raise ValueError(f"the first query (position {q0}) precedes the first key ({k0}), so it has no "
                         "key to attend to; pass keys that start at or before the queries")
    return q0 - k0


@dataclass(frozen=True)
class FlexPrepared:
    """What every layer of one forward shares: the block mask, the offset q0 - k0 (as a number,
    and as the 0-d device tensor score_mod captures) and the scheme's kernel."""

    block_mask: object
    offset: int
    off: torch.Tensor
    # The scheme's DistanceKernel (its parameters clamped, a tabulated lookup covering the call's
    # largest distance), built once per forward instead of in every layer and recomputed layer,
    # as the triton backend's. Its tensors are the per-head parameters, not a bias over positions:
    # shared by the layers, their gradients meet once at the clamp instead of at the parameter.
    # None: each call builds its own (parameters partitioned under ZeRO-3, gathered only inside
    # the layers).
    kernel: object | None = None


def _covering_kernel(scheme, largest_distance: int, device: torch.device):
    """The scheme's DistanceKernel, a tabulated lookup (Sandwich) reaching `largest_distance`."""
    kernel = scheme.fused_kernel()
    return kernel.covering(largest_distance, device) if kernel.tabulate is not None else kernel


@register_backend("flex", priority=30)
class FlexAttention(AttentionBackend):
    # Its prepared state (FlexPrepared): the block mask, from positions and the window, and the
    # scheme's per-head parameters (no bias over positions), so every layer shares it.
    prepares_from_parameters = False
    eager_on_cpu: bool = False  # see the module docstring
    sampled_positions_refusal = ("flex's block mask and score_mod index consecutive positions, and a "
                                 "recipe's drawn positions have gaps; use attention-backend sdpa or reference")

    def unsupported_reason(self, scheme, device, dtype, training, dropout=False):
        if scheme.fused_kernel() is None:
            return (f"pos-emb {scheme.name!r} has score hooks without a fused description "
                    "(fused_kernel() is None), and flex evaluates the bias inside its kernel")
        if dropout:
            return "flex_attention has no attention-probability dropout (set attention-dropout to 0)"
        if device.type == "cpu":
            if training:
                return ("flex_attention has no CPU backward (torch refuses inputs that require grad "
                        "on CPU); flex on CPU is inference only, train on CPU with sdpa or reference")
            if not self.eager_on_cpu and not _cpp_compiler():
                return ("compiled flex on CPU builds a C++ kernel and no C++ compiler was found "
                        "(install g++ or set CXX)")
            return None
        if device.type != "cuda":
            return f"flex runs on CUDA (training and inference) or CPU (inference), not {device.type}"
        from torch.utils._triton import has_triton  # lazy: torch's Triton probe, only when flex is asked about CUDA

        if not has_triton():
            return "flex on CUDA compiles Triton kernels and triton is not importable (pip install triton)"
        return None

    def auto_rank(self, scheme, device, dtype, training):
        # CUDA with a bias/weight only: plain schemes run faster on SDPA's flash path, and on
        # CPU the compile cost makes flex an explicit choice, except for long inference, which
        # resolve.auto_backend decides before ranking. triton (priority 20) ranks first.
        kernel = scheme.fused_kernel()
        if device.type != "cuda" or kernel is None or kernel.is_plain:
            return None
        return self.priority

    def prepare(self, scheme, q_pos, k_pos, window=None, row_starts=None, documents=None) -> FlexPrepared:
        """The block mask and offset for these positions (the layout check's host sync, once) and
        the scheme's kernel."""
        check_window(window)
        offset = _consecutive_offset(q_pos, k_pos)
        if documents is not None:  # queries and keys are the same tokens: offset 0
            block_mask = _document_block_mask(q_pos.numel(), window, documents.starts.to(q_pos.device))
            off = torch.tensor(0, dtype=torch.int64, device=q_pos.device)
        elif row_starts is not None:  # key index of each row's first real token
            first_key = (row_starts.to(k_pos.device) - k_pos[0]).to(torch.int64)
            block_mask, off = _padded_block_mask(q_pos.numel(), k_pos.numel(), offset, window, first_key)
        else:
            block_mask, off = _block_mask(q_pos.numel(), k_pos.numel(), offset, window, q_pos.device)
        kernel = None if partitioned(scheme) else _covering_kernel(scheme, offset + q_pos.numel() - 1, q_pos.device)
        return FlexPrepared(block_mask, offset, off, kernel)

    def forward(self, q, k, v, scheme, q_pos, k_pos, window=None, softmax_in_fp32=False,
                dropout_p=0.0, prepared=None, row_starts=None, documents=None):
        # softmax_in_fp32 needs no flag: flex accumulates the scores and softmax in fp32.
        if dropout_p > 0.0:
            raise ValueError("the flex backend has no attention dropout; resolve_backend should have "
                             "refused it (pass dropout=True there) or set attention-dropout to 0")
        check_window(window)
        D = q.shape[-1]
        if q.device.type == "cuda" and D < 16:
            raise ValueError(f"flex on CUDA needs head_dim >= 16 (Triton's dot), got {D}; use a larger "
                             "head dim or the sdpa / reference backend")
        prepared = prepared or self.prepare(scheme, q_pos, k_pos, window, row_starts, documents)
        kernel = prepared.kernel
        if kernel is None:
            kernel = _covering_kernel(scheme, prepared.offset + q.shape[2] - 1, q.device)
        if q.device.type == "cpu" and torch.is_grad_enabled() and (
                any(x.requires_grad for x in (q, k, v)) or any(t.requires_grad for t in kernel.tensors().values())):
            raise ValueError("flex on CPU is inference only (no CPU backward): run it under "
                             "torch.no_grad(), or use the sdpa or reference backend to train")
        block_mask, off = prepared.block_mask, prepared.off
        score_mod = None if kernel.is_plain else _score_mod(kernel, off)
        fn = flex_attention if q.device.type == "cpu" and self.eager_on_cpu else _compiled_flex()
        return fn(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=1.0 / math.sqrt(D),
                  enable_gqa=kv_group(q, k) > 1)  # (B, H, Lq, D)


@functools.cache
def _cpp_compiler() -> str | None:
    """The C++ compiler inductor would use on CPU, or None."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler  # lazy: loads inductor, only for flex on a CPU
    except ImportError:  # an internal module: fall back to the usual names
        return shutil.which("g++") or shutil.which("c++")
    try:
        return get_cpp_compiler()
    except Exception:  # it raises when its search finds no working compiler
        return None
