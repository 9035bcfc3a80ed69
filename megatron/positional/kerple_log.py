"""KERPLE-log (Chi et al. 2022, arXiv 2205.09921): bias_h(i, j) = -p_h * log(1 + a_h * (i - j)).

p and a are per-head, shared by all layers, initialised p ~ 2*U(0,1), a ~ U(0,1) (the full H
draw, then this rank's heads). Their domain p, a >= 1e-2 is enforced at forward time with a
straight-through clamp, which is what the paper's in-place `.data` clamp amounts to under
mixed precision, without mutating the stored parameter."""
from __future__ import annotations

import torch
from torch import nn

from .base import PositionalScheme, PositionalSpec
from .distance_kernel import DistanceKernel, heads_vector
from .registry import register

EPS = 1e-2


def uniform_heads(spec: PositionalSpec, scale: float) -> nn.Parameter:
    """Per-head parameter (H_local, 1, 1) ~ scale * U(0, 1), drawn for all H heads then sliced so
    every TP layout starts from the same values (the paper draws on each rank separately)."""
    full = torch.rand(spec.num_heads) * scale
    return nn.Parameter(full[spec.head_slice].clone()[:, None, None])


@register("kerple_log")
class KerpleLog(PositionalScheme):
    clamps = {"bias_p": (EPS, None), "bias_a": (EPS, None)}
    head_dims = {"bias_p": 0, "bias_a": 0}  # (H, 1, 1)

    def __init__(self, spec: PositionalSpec):
        super().__init__(spec)
        self.bias_p = uniform_heads(spec, 2.0)  # drawn first, as in the paper's code
        self.bias_a = uniform_heads(spec, 1.0)

    def fused_kernel(self) -> DistanceKernel:
        c = self.clamped()  # -p * log(1 + a * d)
        return DistanceKernel(bias="log", r1=heads_vector(c["bias_p"]), r2=heads_vector(c["bias_a"]))
