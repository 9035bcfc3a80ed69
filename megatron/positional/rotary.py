"""Rotary position embedding (RoPE) in the GPT-NeoX / HF "rotate_half" layout.

Only the first rotary_ndims = int(head_dim * rotary_pct) channels of each head rotate; channel
c < rotary_ndims/2 pairs with c + rotary_ndims/2. cos/sin are computed in fp32 from the positions
on every call (no cache), so any length works, including kv-cache rows (q_pos != k_pos)."""
from __future__ import annotations

import torch

from .base import PositionalScheme, PositionalSpec
from .registry import register


def rotary_inv_freq(dim: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))  # (dim/2,)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


@register("rotary")
class RotaryPositions(PositionalScheme):
    def __init__(self, spec: PositionalSpec):
        super().__init__(spec)
        self.rotary_ndims = int(spec.head_dim * spec.rotary_pct)
        if self.rotary_ndims % 2:
            raise ValueError(
                f"rotary needs an even number of rotated dims, got int(head_dim={spec.head_dim} * "
                f"rotary_pct={spec.rotary_pct}) = {self.rotary_ndims}; adjust rotary-pct")
        # Persistent: K's checkpoints carry `attention.rotary_emb.inv_freq`.
        self.register_buffer("inv_freq", rotary_inv_freq(self.rotary_ndims, spec.rotary_emb_base),
                             persistent=True)

    def _cos_sin(self, positions: torch.Tensor):
        inv_freq = self.inv_freq
        if inv_freq.dtype != torch.float32:  # a bf16-cast model would round the frequencies
            inv_freq = rotary_inv_freq(self.rotary_ndims, self.spec.rotary_emb_base)
        inv_freq = inv_freq.to(positions.device)
        freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # (L, nd/2)
        emb = torch.cat([freqs, freqs], dim=-1)  # (L, nd)
        return emb.cos(), emb.sin()

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: (B, H, L, D); cos/sin: (L, nd) broadcast over B and H
        nd = self.rotary_ndims
        x_rot, x_pass = x[..., :nd].float(), x[..., nd:]
        x_rot = x_rot * cos + rotate_half(x_rot) * sin
        return torch.cat([x_rot.to(x.dtype), x_pass], dim=-1)

    def rotate_qk(self, q, k, q_pos, k_pos):
        # q: (B, H, Lq, D), k: (B, H, Lk, D)
        if self.rotary_ndims == 0:
            return q, k
        cos_k, sin_k = self._cos_sin(k_pos)
        if q_pos is k_pos or torch.equal(q_pos, k_pos):
            cos_q, sin_q = cos_k, sin_k
        else:
            cos_q, sin_q = self._cos_sin(q_pos)
        return self._rotate(q, cos_q, sin_q), self._rotate(k, cos_k, sin_k)
