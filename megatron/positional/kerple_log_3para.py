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

from .base import PositionalScheme, PositionalSpec
from .distance_kernel import DistanceKernel, heads_vector
from .kerple_log import EPS, uniform_heads
from .registry import register

R3_MAX = 2.0


@register("kerple_log_3para")
class KerpleLog3Para(PositionalScheme):
    clamps = {"bias_p": (EPS, None), "bias_a": (EPS, None), "bias_r": (EPS, R3_MAX)}
    head_dims = {"bias_p": 0, "bias_a": 0, "bias_r": 0}  # (H, 1, 1)

    def __init__(self, spec: PositionalSpec):
        super().__init__(spec)
        self.bias_p = uniform_heads(spec, 2.0)
        self.bias_a = uniform_heads(spec, 1.0)
        self.bias_r = nn.Parameter(torch.ones(spec.local_heads, 1, 1))

    def fused_kernel(self) -> DistanceKernel:
        c = self.clamped()  # -r1 * log(1 + r2 * d**r3)
        return DistanceKernel(bias="log", r1=heads_vector(c["bias_p"]), r2=heads_vector(c["bias_a"]),
                              r3=heads_vector(c["bias_r"]))
