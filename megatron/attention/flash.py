"""flash-attn 2 backend: `flash_attn_func`, with its built-in ALiBi for fixed linear slopes; packed
documents (reset-attention-mask) through `flash_attn_varlen_func`.

flash-attn is an OPTIONAL dependency (it needs CUDA and nvcc to build); without it this module
still imports and the backend refuses with an install hint. What it can run:

    plain schemes (rotary, learned, sinusoidal, none: rotation is applied by the caller)
    bias = -slope_h * d with FIXED slopes (alibi, kerple_power_original): alibi_slopes=slopes

flash-attn documents its ALiBi term as -slope * |i + Lk - Lq - j| added to the scaled score of
query row i and key column j (the kernel divides the slope by softmax_scale before scaling), and
aligns the causal mask bottom-right: row i sees columns j <= i + Lk - Lq. Our positions give
d = q_pos[i] - k_pos[j]; with consecutive keys and the queries being the LAST Lq of them
(q_pos = k_pos[Lk - Lq:], training and kv-cache alike) that is exactly i + Lk - Lq - j, so the
two agree; forward() checks that layout. A window W (keys 0 <= d < W) is window_size=(W-1, 0).

Grouped-query k/v (B, H_kv, Lk, D) go in as they are: flash_attn_func documents multi-query and
grouped-query attention for k/v with fewer heads than q (H_kv dividing H), query head h reading
kv head h // (H / H_kv), our grouping; alibi_slopes stay per QUERY head. No copy is made.

Packed documents: every document of the micro-batch is one sequence of flash_attn_varlen_func
over the flattened (B * L) tokens, `cu_seqlens` the documents' starts (PackedDocuments.cu_seqlens,
counted on the host before the batch moves, so no step reads the device) and L the longest
document's bound. ALiBi's distance and the window are relative, the same within a document from
either origin, so the slopes and window_size carry over; positions restarted per document
(reset-position-ids) matter only to what the caller computes from them (embeddings, rotation).

Refused: learnable biases (flash-attn gives alibi_slopes no gradient), non-linear biases (log,
d**p, T5 buckets) and score weights: use triton or flex. Its backward (deterministic=False,
the default) accumulates dq with atomics, so it is not bit-for-bit reproducible."""
from __future__ import annotations

import math

import torch

from megatron.attention.base import AttentionBackend, kv_group
from megatron.attention.mask import check_window, consecutive_starts
from megatron.attention.registry import register_backend

try:
    from flash_attn import flash_attn_func, flash_attn_varlen_func
except ImportError:  # not installed (or built without CUDA): unsupported_reason says so
    flash_attn_func = flash_attn_varlen_func = None

NOT_INSTALLED = "flash-attn is not installed (pip install flash-attn; needs CUDA and nvcc)"


def _scheme_problem(scheme, training: bool) -> str | None:
    """Why flash-attn cannot express this scheme's score hooks, or None."""
    kernel = scheme.fused_kernel()
    name = scheme.name
    if kernel is None:
        return f"pos-emb {name!r} has score hooks without a fused description (fused_kernel() is None)"
    if kernel.has_weight:
        return f"pos-emb {name!r} multiplies the scores (score_weight) and flash-attn can only add ALiBi"
    learnable = training and any(p.requires_grad for p in scheme.parameters())
    if kernel.bias == "power" and kernel.r3 is None:  # -r2 * d: ALiBi's form
        if learnable:
            return (f"pos-emb {name!r} learns its slopes and flash-attn gives no gradient to "
                    "alibi_slopes; use triton or flex")
        return None
    if kernel.bias != "none":
        kind = "d**p power" if kernel.bias == "power" else kernel.bias
        extra = " and it gives no gradient to alibi_slopes" if learnable else ""
        return (f"pos-emb {name!r} has a {'learnable ' if learnable else ''}{kind} bias; flash-attn's only "
                f"bias is ALiBi's -slope * distance{extra}; use triton or flex")
    return None


def _check_layout(q_pos: torch.Tensor, k_pos: torch.Tensor) -> None:
    """flash-attn aligns queries to the LAST keys: require consecutive keys, q_pos = k_pos[-Lq:]."""
    lq, lk = q_pos.numel(), k_pos.numel()
    starts = consecutive_starts(q_pos, k_pos)
    if lq > lk or starts is None or starts[0] != starts[1] + lk - lq:
        raise ValueError("the flash backend needs consecutive key positions with the queries at the last Lq "
                         "of them (q_pos = k_pos[-Lq:], as in training and kv-cache decoding); use the sdpa "
                         "or reference backend for other layouts")


@register_backend("flash", priority=10)
class FlashAttention(AttentionBackend):
    prepares_from_parameters = False  # its prepared state: a layout check
    # flash_attn_func takes no key-padding mask (padded batches would need its varlen entry point
    # and unpadded inputs): the resolver picks another backend for them.
    takes_padding = False
    sampled_positions_refusal = ("flash-attn aligns queries and keys by index (causal mask and ALiBi distance "
                                 "i + Lk - Lq - j), so a recipe's gapped positions would be read as consecutive; "
                                 "use attention-backend sdpa or reference")

    def unsupported_reason(self, scheme, device, dtype, training, dropout=False):
        # Scheme first: it holds on every machine, so the message is the same everywhere.
        problem = _scheme_problem(scheme, training)
        if problem is not None:
            return problem
        if flash_attn_func is None:
            return NOT_INSTALLED
        if device.type != "cuda":
            return f"flash-attn runs on CUDA only, not {device.type}"
        if dtype not in (torch.float16, torch.bfloat16):
            return f"flash-attn runs fp16/bf16 only, not {str(dtype).replace('torch.', '')}"
        if torch.cuda.get_device_capability(device) < (8, 0):
            return "flash-attn 2 needs an Ampere or newer GPU (compute capability 8.0+)"
        return None

    def prepare(self, scheme, q_pos, k_pos, window=None, row_starts=None, documents=None):
        check_window(window)
        if row_starts is not None:
            raise ValueError("the flash backend takes no padded batches; use attention-backend triton, sdpa or auto")
        _check_layout(q_pos, k_pos)
        if documents is not None and q_pos.numel() != k_pos.numel():
            raise ValueError("packed documents need queries and keys at the same positions (no kv-cache)")
        return True  # checked: nothing else depends on the positions

    def forward(self, q, k, v, scheme, q_pos, k_pos, window=None, softmax_in_fp32=False,
                dropout_p=0.0, prepared=None, row_starts=None, documents=None):
        # softmax_in_fp32 needs no flag: flash-attn accumulates the softmax in fp32.
        if flash_attn_func is None:
            raise ValueError(NOT_INSTALLED)
        if prepared is None or row_starts is not None:
            self.prepare(scheme, q_pos, k_pos, window, row_starts, documents)
        kv_group(q, k)  # flash-attn's own check of the head counts reads less plainly
        kernel = scheme.fused_kernel()
        assert not kernel.has_weight and kernel.bias in ("none", "power") and kernel.r3 is None, (
            "resolve_backend should have refused this scheme")
        slopes = None  # (H,) float32 contiguous, as flash-attn requires
        if kernel.bias == "power":
            slopes = (kernel.r2.detach().float().contiguous() if kernel.r2 is not None
                      else torch.ones(q.shape[1], dtype=torch.float32, device=q.device))
        options = dict(dropout_p=dropout_p, softmax_scale=1.0 / math.sqrt(q.shape[-1]), causal=True,
                       window_size=(-1, -1) if window is None else (window - 1, 0), alibi_slopes=slopes)
        if documents is not None:
            return _documents_forward(q, k, v, documents, options)
        out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), **options)  # (B, L, H, D) views
        return out.transpose(1, 2)  # (B, H, Lq, D)


def _documents_forward(q, k, v, documents, options) -> torch.Tensor:
    """q (B, H, L, D), k and v (B, H_kv, L, D) of packed rows: each document one varlen sequence
    (module docstring). Returns (B, H, L, D)."""
    B, H, L, D = q.shape
    cu = documents.cu_seqlens.to(q.device)

    def tokens(x):  # (B, heads, L, D) -> (B * L, heads, D)
        return x.transpose(1, 2).reshape(B * L, x.shape[1], D)

    out = flash_attn_varlen_func(tokens(q), tokens(k), tokens(v), cu, cu, L, L, **options)  # (B * L, H, D)
    return out.view(B, L, H, D).transpose(1, 2)
