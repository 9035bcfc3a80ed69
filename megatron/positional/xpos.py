"""xPos: rotary with a per-dimension exponential decay (Sun et al., "A Length-Extrapolatable
Transformer", arXiv 2212.10554, section 3.2; the authors' code: microsoft/torchscale,
torchscale/component/xpos_relative_position.py).

Rotary pair i (of d/2 = rotary_ndims/2) gets zeta_i = (i/(d/2) + gamma) / (1 + gamma) in (0, 1];
a query at position m is scaled by zeta_i^(m/scale_base) and a key at n by zeta_i^(-n/scale_base),
so their product decays as zeta_i^((m-n)/scale_base) with the distance (m >= n, causal).

Overflow: zeta^(-n/scale_base) alone is exp(160) at n = 64k (gamma 0.4, scale base 512), beyond
fp32 and bf16. Only the product matters, so every call scales relative to a centre c (the middle
of the positions it sees, as torchscale does): q by zeta^((m-c)/sb), k by zeta^(-(n-c)/sb). Each
factor is then at most zeta_min^(-span/2/sb): finite up to a span of ~72k positions at the
defaults, and every causal product (m >= n) is <= 1. Entries above the diagonal (n > m) may still
overflow beyond ~36k positions; backends mask them by selection (reference, SDPA's causal path),
but a float-mask path (SDPA with a window) would add -inf to +inf: beyond the train length use
the paper's blockwise causal attention (evaluate.py --blockwise-causal), whose calls span at most
the train length.

Because c depends on the call's positions, the kv-cache keeps xPos keys unrotated and every call
rotates all of them (`rotate_after_cache`), as torchscale's incremental decoding does."""
from __future__ import annotations

import torch

from .base import PositionalSpec
from .registry import register
from .rotary import RotaryPositions


@register("xpos")
class XPos(RotaryPositions):
    rotate_after_cache = True

    def __init__(self, spec: PositionalSpec):
        super().__init__(spec)
        self.scale_base = float(spec.options.get("xpos_scale_base", 512.0))
        self.gamma = float(spec.options.get("xpos_gamma", 0.4))
        if not self.scale_base > 0:
            raise ValueError(f"xpos-scale-base must be > 0, got {self.scale_base}")
        if not self.gamma > 0:
            raise ValueError(f"xpos-gamma must be > 0 (zeta_0 = gamma / (1 + gamma)), got {self.gamma}")
        if self.scaling.kind != "none":
            raise ValueError("rotary-scaling applies to pos-emb rotary only; set rotary-scaling: none for xpos")

    def log_zeta(self, device) -> torch.Tensor:
        """ln zeta_i (nd/2,) fp32, all <= 0."""
        half = self.rotary_ndims // 2
        i = torch.arange(half, dtype=torch.float32, device=device)
        return torch.log((i / half + self.gamma) / (1 + self.gamma))

    def _decay(self, positions: torch.Tensor, centre: torch.Tensor, sign: float) -> torch.Tensor:
        """zeta^(sign * (positions - centre) / scale_base) as (L, nd), laid out like cos/sin."""
        rel = (positions.to(torch.float32) - centre) / self.scale_base  # (L,), |rel| <= span / 2 / sb
        scale = torch.exp(sign * rel[:, None] * self.log_zeta(positions.device)[None, :])  # (L, nd/2)
        return torch.cat([scale, scale], dim=-1)

    def rotate_qk(self, q, k, q_pos, k_pos):
        # q: (B, H, Lq, D), k: (B, H, Lk, D)
        if self.rotary_ndims == 0:
            return q, k
        lo = torch.minimum(q_pos.min(), k_pos.min()).to(torch.float32)
        hi = torch.maximum(q_pos.max(), k_pos.max()).to(torch.float32)
        centre = (lo + hi) / 2  # no host sync
        cos_q, sin_q = self._cos_sin(q_pos)
        cos_k, sin_k = self._cos_sin(k_pos)
        return (self._rotate(q, cos_q, sin_q, self._decay(q_pos, centre, 1.0)),
                self._rotate(k, cos_k, sin_k, self._decay(k_pos, centre, -1.0)))
