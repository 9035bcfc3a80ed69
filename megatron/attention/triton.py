"""Triton backend: one fused attention kernel (megatron/attention/kernels/attention.py) for every
shift-invariant score-bias scheme.

FlashAttention-2-style online softmax with the scheme's bias (and bias+wht weight) computed on the
fly from per-head parameters (the scheme's DistanceKernel), so memory is O(L), never [H, L, L].
The backward returns dq, dk, dv and the parameter gradients, reduced without atomics (bitwise
reproducible). See megatron/attention/kernels/ for the kernels.

On CUDA this is the preferred backend for score-bias schemes ("auto" picks it). On CPU Triton has
no driver; with TRITON_INTERPRET=1 set before start-up the kernels run in Triton's interpreter,
which is how the test suite checks them without a GPU (very slow: tests only)."""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import torch

from megatron.attention.base import AttentionBackend, partitioned
from megatron.attention.mask import check_window, consecutive_starts
from megatron.attention.registry import register_backend

MAX_HEAD_DIM = 256  # per-program tiles of [BLOCK, head_dim] must fit in shared memory


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@dataclass(frozen=True)
class TritonPrepared:
    """What every layer of one forward shares: the positions' starts and the scheme's kernel."""

    q0: int
    k0: int
    # The scheme's DistanceKernel, built (its parameters clamped and cast) once per forward
    # instead of in every layer and recomputed layer, and the ForwardGradients its calls reduce
    # their parameter gradients into, once (kernels/attention.py share_kernel). None: each call
    # builds its own (parameters partitioned under ZeRO-3, gathered only inside the layers).
    kernel: object | None = None
    shared: object | None = None


@register_backend("triton", priority=20)
class TritonAttention(AttentionBackend):
    # Its prepared state (TritonPrepared) holds the scheme's per-head parameters, not a bias
    # over positions: shared by the layers, their gradients are summed once over all layers
    # (kernels/attention.py ForwardGradients) instead of per layer, so every layer shares it.
    prepares_from_parameters = False
    sampled_positions_refusal = ("the fused kernels index consecutive positions (start + 0..L-1) and a recipe's "
                                 "drawn positions have gaps; use attention-backend sdpa or reference")

    def unsupported_reason(self, scheme, device, dtype, training, dropout=False):
        # Scheme and dropout first: they hold on every machine, so the message is the same everywhere.
        if scheme.fused_kernel() is None:
            return f"pos-emb {scheme.name!r} has no fused description (PositionalScheme.fused_kernel)"
        if dropout:
            return "the fused kernel has no attention dropout (set attention-dropout 0, as the paper does)"
        if importlib.util.find_spec("triton") is None:
            return "triton is not installed (pip install triton)"
        if device.type == "cpu" and not _interpreting():
            return ("Triton has no CPU driver (set TRITON_INTERPRET=1 before start-up to run the kernel "
                    "in Triton's interpreter: correct but very slow, for tests)")
        if device.type not in ("cuda", "cpu"):
            return f"no Triton driver for device {device.type!r}"
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            return f"dtype {dtype} is not supported (float32, bfloat16, float16)"
        return None

    def auto_rank(self, scheme, device, dtype, training):
        # Only worth it for score-bias schemes on a GPU: SDPA's flash path is faster without a
        # bias, and the interpreter is for tests only.
        if device.type != "cuda" or scheme.fused_kernel().is_plain:
            return None
        return self.priority

    def prepare(self, scheme, q_pos, k_pos, window=None, row_starts=None, documents=None) -> TritonPrepared:
        """The first query and key positions (the kernel indexes by them) and the scheme's kernel."""
        check_window(window)
        starts = consecutive_starts(q_pos, k_pos)
        if starts is None:
            raise ValueError("the triton attention backend needs consecutive query positions and consecutive key positions "
                             "(start + 0..L-1); use attention-backend sdpa or reference for arbitrary positions")
        q0, k0 = starts
        if partitioned(scheme):
            return TritonPrepared(q0, k0)
        from megatron.attention.kernels.attention import share_kernel  # lazy: imports Triton, only when this backend runs

        # A tabulated lookup (Sandwich) covers the call's largest distance here, once.
        kernel = scheme.fused_kernel().covering(q0 + q_pos.numel() - 1 - k0, q_pos.device)
        return TritonPrepared(q0, k0, *share_kernel(kernel))

    def forward(self, q, k, v, scheme, q_pos, k_pos, window=None, softmax_in_fp32=False,
                dropout_p=0.0, prepared=None, row_starts=None, documents=None):
        # softmax_in_fp32 needs no flag: the kernel keeps scores and the softmax in fp32.
        if dropout_p > 0.0:
            raise ValueError("the triton attention backend has no attention dropout; set attention-dropout 0 "
                             "or attention-backend sdpa")
        check_window(window)
        if q.shape[-1] > MAX_HEAD_DIM:
            raise ValueError(f"the triton attention backend supports head_dim <= {MAX_HEAD_DIM}, got {q.shape[-1]}")
        from megatron.attention.kernels.attention import triton_attention  # lazy: imports Triton (see prepare)

        prepared = prepared or self.prepare(scheme, q_pos, k_pos, window)
        kernel = prepared.kernel if prepared.kernel is not None else scheme.fused_kernel()
        bounds = None if documents is None else documents.bounds  # (B, 2, L): tiles across documents skipped
        return triton_attention(q, k, v, kernel, prepared.q0, prepared.k0, window, row_starts,
                                prepared.shared, bounds)  # (B, H, Lq, D)
