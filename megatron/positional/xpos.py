"""xPos: rotary with a per-dimension exponential decay (Sun et al., "A Length-Extrapolatable
Transformer", arXiv 2212.10554, section 3.2; the authors' code: microsoft/torchscale,
torchscale/component/xpos_relative_position.py).

Rotary pair i (of d/2 = rotary_ndims/2) gets zeta_i = (i/(d/2) + gamma) / (1 + gamma) in (0, 1];
a query at position m is scaled by zeta_i^(m/scale_base) and a key at n by zeta_i^(-n/scale_base),
so their product decays as zeta_i^((m-n)/scale_base) with the distance (m >= n, causal).

Overflow: zeta^(-n/scale_base) alone is exp(160) at n = 64k (gamma 0.4, scale base 512), beyond
fp32 and bf16. Only the product matters, so every call scales relative to a centre c, the middle
of its QUERY positions: q by zeta^((m-c)/sb), k by zeta^(-(n-c)/sb). A query factor is then at
most e^T with T = |ln zeta_0| * span / 2 / sb (span: the queries' extent), a causal key's (n <=
max query) at most e^T too, and keys far behind the queries only underflow towards 0 (their true
product with a query is below e^(T - 87): nothing lost). One elementwise scaling per call cannot
do better: exactness on every causal pair forces factors linear in the position, so a span of L
needs factors up to e^(|ln zeta_0| L / 2 / sb), inf past 6,338 positions with sb 64, gamma 0.2.
So `max_query_span` bounds T by ln(dtype max) / 4 (products above the diagonal, masked but
computed, stay finite: e^2T * |q||k|), and the attention runs longer calls in query blocks of
that span, each with its own centre (megatron/model/attention.py; 18k positions per block at the
defaults in fp32/bf16, so common lengths are one block, as before).

Because c depends on the call's positions, the kv-cache keeps xPos keys unrotated and every call
rotates all of them (`rotate_after_cache`), as torchscale's incremental decoding does."""
from __future__ import annotations

import math

import torch

from .base import PositionalSpec
from .options import Option
from .registry import register
from .rotary import ROTARY_EMB_BASE, ROTARY_PCT, RotaryPositions, over_heads

SCALE_BASE = Option("xpos_scale_base", float, 512.0,
                    "xPos (pos-emb xpos): the position scale base; q is scaled by zeta^(n/scale-base) and k by "
                    "its inverse (Sun et al. 2022 use 512).", gt=0)
GAMMA = Option("xpos_gamma", float, 0.4,
               "xPos: zeta_i = (i/(d/2) + gamma) / (1 + gamma) per rotary dimension pair i (the paper's 0.4).", gt=0)


@register("xpos")
class XPos(RotaryPositions):
    rotate_after_cache = True
    options = (ROTARY_PCT, ROTARY_EMB_BASE, SCALE_BASE, GAMMA)  # rotary's, without its scaling

    def __init__(self, spec: PositionalSpec):
        super().__init__(spec)
        self.scale_base = float(self.option("xpos_scale_base"))
        self.gamma = float(self.option("xpos_gamma"))
        if not self.scale_base > 0:
            raise ValueError(f"xpos-scale-base must be > 0, got {self.scale_base}")
        if not self.gamma > 0:
            raise ValueError(f"xpos-gamma must be > 0 (zeta_0 = gamma / (1 + gamma)), got {self.gamma}")
        if self.scaling.kind != "none":
            raise ValueError("rotary-scaling applies to pos-emb rotary only; set rotary-scaling: none for xpos")
        # |ln zeta_0| / sb, the steepest decay: max_query_span's, computed once on the host (it
        # was a read of a fresh tensor in every layer of every forward).
        self.steepest = -float(self.log_zeta("cpu").min()) / self.scale_base if self.rotary_ndims else 0.0

    def log_zeta(self, device) -> torch.Tensor:
        """ln zeta_i (nd/2,) fp32, all <= 0."""
        half = self.rotary_ndims // 2
        i = torch.arange(half, dtype=torch.float32, device=device)
        return torch.log((i / half + self.gamma) / (1 + self.gamma))

    def max_query_span(self, dtype) -> int | None:
        """Query positions per call whose factors stay within e^T, T = ln(max of dtype) / 4 (module
        docstring): 1,584 positions at sb 64, gamma 0.2 in fp32; 18,130 at the defaults."""
        if self.rotary_ndims == 0:
            return None
        bound = math.log(torch.finfo(dtype).max) / 4
        return max(int(2 * bound / self.steepest), 1)

    def _decay(self, positions: torch.Tensor, centre: torch.Tensor, sign: float, dtype) -> torch.Tensor:
        """zeta^(sign * (positions - centre) / scale_base) as (L, nd), laid out like cos/sin, in
        fp32 (float64 for a float64 model: its range holds ~8x the span)."""
        rel = (positions.to(dtype) - centre) / self.scale_base  # (L,) or (B, L), |rel| <= span / 2 / sb
        scale = torch.exp(sign * rel[..., None] * self.log_zeta(positions.device).to(dtype))  # (..., L, nd/2)
        return over_heads(torch.cat([scale, scale], dim=-1))

    def rotate_qk(self, q, k, q_pos, k_pos):
        # q: (B, H, Lq, D), k: (B, H, Lk, D)
        if self.rotary_ndims == 0:
            return q, k
        wide = torch.promote_types(q.dtype, torch.float32)  # the dtype _rotate computes in
        # no host sync; each row's own centre for rows at their own positions ((B, 1))
        centre = (q_pos.amin(-1, keepdim=True) + q_pos.amax(-1, keepdim=True)).to(wide) / 2
        cos_q, sin_q = self._cos_sin(q_pos)
        cos_k, sin_k = self._cos_sin(k_pos)
        return (self._rotate(q, cos_q, sin_q, self._decay(q_pos, centre, 1.0, wide)),
                self._rotate(k, cos_k, sin_k, self._decay(k_pos, centre, -1.0, wide)))
