"""Rotary position embedding (RoPE) in the GPT-NeoX / HF "rotate_half" layout.

Only the first rotary_ndims = int(head_dim * rotary_pct) channels of each head rotate; channel
c < rotary_ndims/2 pairs with c + rotary_ndims/2. cos/sin are computed in fp32 from the positions
on every call (no cache), so any length works, including kv-cache rows (q_pos != k_pos).

`rotary-scaling` (rope_scaling.py: linear, ntk, dynamic, yarn, llama3) changes the frequencies, and
for YaRN the scale of q and k, at compute time: the `inv_freq` buffer keeps the trained frequencies,
so a checkpoint trained without scaling loads unchanged and is evaluated with any scaling. `dynamic`
takes its length from the call's positions: the largest query or key position + 1 (a kv-cache call's
new rows end the sequence so far)."""
from __future__ import annotations

import torch

from .base import PositionalScheme, PositionalSpec
from .options import Option
from .registry import register
from .rope_scaling import OPTIONS as SCALING_OPTIONS
from .rope_scaling import RopeScaling, scaling_problems

ROTARY_PCT = Option("rotary_pct", float, 1.0, "Fraction of each head's dimensions rotated by rotary (and xPos).",
                    gt=0, le=1)
ROTARY_EMB_BASE = Option("rotary_emb_base", int, 10000, "Rotary (and xPos) frequency base.", ge=1)


def rotary_inv_freq(dim: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))  # (dim/2,)


def over_heads(table: torch.Tensor) -> torch.Tensor:
    """A per-position table (L, nd) as it is, or (B, L, nd) of rows at their own positions as
    (B, 1, L, nd): either broadcasts over q and k's (B, H, L, D)."""
    return table.unsqueeze(1) if table.dim() == 3 else table


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


@register("rotary")
class RotaryPositions(PositionalScheme):
    options = (ROTARY_PCT, ROTARY_EMB_BASE, *SCALING_OPTIONS)

    def __init__(self, spec: PositionalSpec):
        super().__init__(spec)
        pct, self.base = ROTARY_PCT.read(spec.options), ROTARY_EMB_BASE.read(spec.options)
        self.rotary_ndims = int(spec.head_dim * pct)
        if self.rotary_ndims % 2:
            raise ValueError(
                f"rotary needs an even number of rotated dims, got int(head_dim={spec.head_dim} * "
                f"rotary_pct={pct}) = {self.rotary_ndims}; adjust rotary-pct")
        # Persistent: K's checkpoints carry `attention.rotary_emb.inv_freq`.
        self.register_buffer("inv_freq", rotary_inv_freq(self.rotary_ndims, self.base), persistent=True)
        self.scaling = RopeScaling.from_options(spec.options, spec.options.get("seq_length") or spec.max_position_embeddings)

    @classmethod
    def option_problems(cls, values: dict) -> list[tuple[str, str]]:
        return scaling_problems(values)

    def _inv_freq(self, device, length: torch.Tensor | None = None) -> torch.Tensor:
        """The frequencies in use (nd/2,) fp32: the trained ones, scaled by rotary-scaling (at the
        call's `length` for a length-dependent scaling)."""
        inv_freq = self.inv_freq
        if inv_freq.dtype != torch.float32:  # a bf16-cast model would round the frequencies
            inv_freq = rotary_inv_freq(self.rotary_ndims, self.base)
        return self.scaling.inv_freq(inv_freq.to(device), self.rotary_ndims, self.base, length)

    def _cos_sin(self, positions: torch.Tensor, length: torch.Tensor | None = None):
        inv_freq = self._inv_freq(positions.device, length)
        freqs = positions.to(torch.float32)[..., None] * inv_freq  # (L, nd/2), (B, L, nd/2) per row
        emb = torch.cat([freqs, freqs], dim=-1)  # (..., L, nd)
        return over_heads(emb.cos()), over_heads(emb.sin())

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                scale: torch.Tensor | None = None) -> torch.Tensor:
        # x: (B, H, L, D); cos/sin (and xPos's per-dimension scale): (L, nd) broadcast over B and H,
        # or (B, 1, L, nd) for rows at their own positions (over_heads)
        nd = self.rotary_ndims
        # fp32 at least (a float64 model keeps float64: tests' references)
        x_rot, x_pass = x[..., :nd].to(torch.promote_types(x.dtype, torch.float32)), x[..., nd:]
        x_rot = x_rot * cos + rotate_half(x_rot) * sin
        if scale is not None:
            x_rot = x_rot * scale
        out = torch.cat([x_rot.to(x.dtype), x_pass], dim=-1)
        factor = self.scaling.attention_factor()  # YaRN: q and k, all dims (the paper's sqrt(1/t))
        return out if factor == 1.0 else out * factor

    def rotate_qk(self, q, k, q_pos, k_pos):
        # q: (B, H, Lq, D), k: (B, H, Lk, D)
        if self.rotary_ndims == 0:
            return q, k
        if self.scaling.length_dependent and q_pos.dim() == 2:  # each row's own length (dynamic NTK)
            rows = [self.rotate_qk(q[b:b + 1], k[b:b + 1], q_pos[b], k_pos[b] if k_pos.dim() == 2 else k_pos)
                    for b in range(q_pos.shape[0])]
            return torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows])
        length = torch.maximum(q_pos.max(), k_pos.max()) + 1 if self.scaling.length_dependent else None
        cos_k, sin_k = self._cos_sin(k_pos, length)
        if q_pos is k_pos or torch.equal(q_pos, k_pos):
            cos_q, sin_q = cos_k, sin_k
        else:
            cos_q, sin_q = self._cos_sin(q_pos, length)
        return self._rotate(q, cos_q, sin_q), self._rotate(k, cos_k, sin_k)
