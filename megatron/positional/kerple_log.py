"""KERPLE-log (Chi et al. 2022, arXiv 2205.09921): bias_h(i, j) = -p_h * log(1 + a_h * (i - j)).

p and a are per-head, shared by all layers, initialised p ~ 2*U(0,1), a ~ U(0,1) (the full H
draw, then this rank's heads). Their domain p, a >= 1e-2 is enforced at forward time with a
straight-through clamp, which is what the paper's in-place `.data` clamp amounts to under
mixed precision, without mutating the stored parameter."""
from __future__ import annotations

import torch
from torch import nn

from megatron.positional.base import (
    PositionalScheme,
    PositionalSpec,
    causal_distance,
    clamp_straight_through,
    summary_stats,
)
from megatron.positional.fused import DistanceKernel, heads_vector
from megatron.positional.registry import register

EPS = 1e-2


def uniform_heads(spec: PositionalSpec, scale: float) -> nn.Parameter:
    """Per-head parameter (H_local, 1, 1) ~ scale * U(0, 1), drawn for all H heads then sliced so
    every TP layout starts from the same values (the paper draws on each rank separately)."""
    full = torch.rand(spec.num_heads) * scale
    return nn.Parameter(full[spec.head_slice].clone()[:, None, None])


@register("kerple_log")
class KerpleLog(PositionalScheme):
    has_score_bias = True

    def __init__(self, spec: PositionalSpec):
        super().__init__(spec)
        self.bias_p = uniform_heads(spec, 2.0)  # drawn first, as in the paper's code
        self.bias_a = uniform_heads(spec, 1.0)

    def clamped(self) -> dict[str, torch.Tensor]:
        return {"bias_p": clamp_straight_through(self.bias_p.float(), min=EPS),
                "bias_a": clamp_straight_through(self.bias_a.float(), min=EPS)}

    def score_bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        c = self.clamped()
        d = causal_distance(q_pos, k_pos)  # (Lq, Lk), clamped at 0 above the diagonal
        return -c["bias_p"] * torch.log1p(c["bias_a"] * d)  # (H_local, Lq, Lk)

    def fused_kernel(self) -> DistanceKernel:
        c = self.clamped()
        return DistanceKernel(bias="log", r1=heads_vector(c["bias_p"]), r2=heads_vector(c["bias_a"]))

    def stats(self) -> dict[str, float]:
        out = {}
        for name, value in self.clamped().items():
            out.update(summary_stats(name, value))
        return out
