"""KERPLE "3-para-log": bias_h(i, j) = -r1 * log(1 + r2 * (i - j)^r3).

The paper (Fig. 1 caption) describes this three-parameter log kernel, but its released code does
NOT implement it; this is our implementation. Parameters (per head, shared by all layers):
    bias_p = r1 ~ 2*U(0,1),  domain >= 1e-2
    bias_a = r2 ~ U(0,1),    domain >= 1e-2
    bias_r = r3 = 1.0,       domain [1e-2, 2]
r1 and r2 are drawn exactly like kerple_log's p and a (same RNG order), and r3 starts at 1, so
with the same seed the scheme starts as exactly the kerple_log model and learns the exponent."""
from __future__ import annotations

import torch
from torch import nn

from megatron.positional.base import (
    PositionalScheme,
    PositionalSpec,
    causal_distance,
    clamp_straight_through,
    pow_distance,
    summary_stats,
)
from megatron.positional.fused import DistanceKernel, heads_vector
from megatron.positional.kerple_log import EPS, uniform_heads
from megatron.positional.registry import register

R3_MAX = 2.0


@register("kerple_log_3para")
class KerpleLog3Para(PositionalScheme):
    has_score_bias = True

    def __init__(self, spec: PositionalSpec):
        super().__init__(spec)
        self.bias_p = uniform_heads(spec, 2.0)
        self.bias_a = uniform_heads(spec, 1.0)
        self.bias_r = nn.Parameter(torch.ones(spec.local_heads, 1, 1))

    def clamped(self) -> dict[str, torch.Tensor]:
        return {"bias_p": clamp_straight_through(self.bias_p.float(), min=EPS),
                "bias_a": clamp_straight_through(self.bias_a.float(), min=EPS),
                "bias_r": clamp_straight_through(self.bias_r.float(), min=EPS, max=R3_MAX)}

    def score_bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        c = self.clamped()
        d = causal_distance(q_pos, k_pos)  # (Lq, Lk)
        return -c["bias_p"] * torch.log1p(c["bias_a"] * pow_distance(d, c["bias_r"]))  # (H_local, Lq, Lk)

    def fused_kernel(self) -> DistanceKernel:
        c = self.clamped()
        return DistanceKernel(bias="log", r1=heads_vector(c["bias_p"]), r2=heads_vector(c["bias_a"]),
                              r3=heads_vector(c["bias_r"]))

    def stats(self) -> dict[str, float]:
        out = {}
        for name, value in self.clamped().items():
            out.update(summary_stats(name, value))
        return out
