"""PyTorch scaled_dot_product_attention backend.

No bias and no window with q_pos == k_pos == consecutive positions: the built-in causal path
(is_causal=True, no mask tensor). Otherwise the scheme's bias and the causal/window mask are
folded into one float mask (bias + where(allowed, 0, -inf)); SDPA adds it after its scaling,
the same placement as the reference, and autograd carries the gradient back through the mask
to the scheme's parameters. SDPA cannot multiply scores, so score_weight schemes are refused."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from megatron.attention.base import AttentionBackend
from megatron.attention.mask import allowed_mask, check_window, consecutive_starts
from megatron.attention.registry import register_backend


@dataclass(frozen=True)
class SDPAPrepared:
    mask: torch.Tensor | None  # fp32 (H or 1, Lq, Lk) float mask, or None: the built-in causal path


@register_backend("sdpa", priority=100)
class SDPAAttention(AttentionBackend):
    def unsupported_reason(self, scheme, device, dtype, training, dropout=False):
        if scheme.has_score_weight:
            return (f"pos-emb {scheme.name!r} multiplies the scores (score_weight) and SDPA can "
                    "only add a mask to them")
        return None

    def prepare(self, scheme, q_pos, k_pos, window=None):
        """The float mask (H or 1, Lq, Lk) in fp32, or None for the built-in causal path: no bias,
        no window and q_pos == k_pos consecutive (is_causal=True then equals the positional mask)."""
        check_window(window)
        bias = scheme.score_bias(q_pos, k_pos)  # (H, Lq, Lk) float32 or None
        if bias is None and window is None and _is_plain_causal(q_pos, k_pos):
            return SDPAPrepared(None)
        allowed = allowed_mask(q_pos, k_pos, window)  # (Lq, Lk)
        mask = torch.zeros(allowed.shape, dtype=torch.float32, device=q_pos.device)
        mask = mask.masked_fill(~allowed, float("-inf"))  # (Lq, Lk)
        if bias is not None:
            mask = bias + mask  # (H, Lq, Lk); -inf stays -inf, gradient flows to the bias
        return SDPAPrepared(mask)

    def forward(self, q, k, v, scheme, q_pos, k_pos, window=None, softmax_in_fp32=False,
                dropout_p=0.0, prepared=None):
        # softmax_in_fp32 needs no flag: SDPA's kernels accumulate the softmax in fp32.
        assert not scheme.has_score_weight, "resolve_backend should have refused this scheme"
        scale = 1.0 / math.sqrt(q.shape[-1])
        mask = (prepared or self.prepare(scheme, q_pos, k_pos, window)).mask
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True,
                                                  scale=scale)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), dropout_p=dropout_p,
                                              scale=scale)  # (B, H, Lq, D)


def _is_plain_causal(q_pos: torch.Tensor, k_pos: torch.Tensor) -> bool:
    """True when is_causal=True (key index <= query index) equals the positional causal mask."""
    if q_pos.shape != k_pos.shape:
        return False
    if q_pos.numel() < 2:
        return torch.equal(q_pos, k_pos)
    starts = consecutive_starts(q_pos, k_pos)
    return starts is not None and starts[0] == starts[1]
