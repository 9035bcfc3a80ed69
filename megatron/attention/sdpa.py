"""PyTorch scaled_dot_product_attention backend.

No bias and no window with q_pos == k_pos == consecutive positions: the built-in causal path
(is_causal=True, no mask tensor). Otherwise the scheme's bias and the causal/window mask are
folded into one float mask (bias + where(allowed, 0, -inf)); SDPA adds it after its scaling,
the same placement as the reference, and autograd carries the gradient back through the mask
to the scheme's parameters. SDPA cannot multiply scores, so score_weight schemes are refused."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from megatron.attention.base import AttentionBackend
from megatron.attention.mask import allowed_mask
from megatron.attention.registry import register_backend


def _is_plain_causal(q_pos: torch.Tensor, k_pos: torch.Tensor) -> bool:
    """True when is_causal=True (key index <= query index) equals the positional causal mask."""
    if q_pos.shape != k_pos.shape or not torch.equal(q_pos, k_pos):
        return False
    return q_pos.numel() < 2 or bool((q_pos[1:] - q_pos[:-1] == 1).all())


@register_backend("sdpa", priority=100)
class SDPAAttention(AttentionBackend):
    def unsupported_reason(self, scheme, device, dtype, training, dropout=False):
        if scheme.has_score_weight:
            return (f"pos-emb {scheme.name!r} multiplies the scores (score_weight) and SDPA can "
                    "only add a mask to them")
        return None

    def forward(self, q, k, v, scheme, q_pos, k_pos, window=None, softmax_in_fp32=False,
                dropout_p=0.0):
        # softmax_in_fp32 needs no flag: SDPA's kernels accumulate the softmax in fp32.
        assert not scheme.has_score_weight, "resolve_backend should have refused this scheme"
        scale = 1.0 / math.sqrt(q.shape[-1])
        bias = scheme.score_bias(q_pos, k_pos)  # (H, Lq, Lk) float32 or None
        if bias is None and window is None and _is_plain_causal(q_pos, k_pos):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True,
                                                  scale=scale)
        allowed = allowed_mask(q_pos, k_pos, window)  # (Lq, Lk)
        mask = torch.zeros(allowed.shape, dtype=torch.float32, device=q.device)
        mask = mask.masked_fill(~allowed, float("-inf"))  # (Lq, Lk)
        if bias is not None:
            mask = bias + mask  # (H, Lq, Lk); -inf stays -inf, gradient flows to the bias
        mask = mask.to(q.dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                              scale=scale)  # (B, H, Lq, D)
