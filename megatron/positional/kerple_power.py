"""KERPLE-power family (Chi et al. 2022): a bias kernel and/or a multiplicative weight kernel.

    bias_h(i, j)   = -a_b * d^p_b          (d = i - j)
    weight_h(i, j) = exp(-a_w * d^p_w)
    scores'        = scores * weight + bias   (after the 1/sqrt(head_dim) scaling)

The variant is parsed from the name exactly like the paper's code: `bias_arg, wei_arg =
name.split('_')[-2:]`; a parameter exists when 'p' / 'a' appears in its arg. A missing p means
exponent 1, a missing a means factor 1. Names:
    kerple_power_ap_     bias only (the paper's KERPLE-power)
    kerple_power__ap     weight only (ablation)
    kerple_power_ap_ap   bias + weight ("bias+wht")
    kerple_power_original  -slope_h * d with ALiBi slopes as a frozen parameter
Domains (forward-time straight-through clamps): p in [1e-2, 2], a >= 1e-2."""
from __future__ import annotations

import torch
from torch import nn

from .alibi import alibi_slopes
from .base import PositionalScheme, PositionalSpec
from .distance_kernel import DistanceKernel, heads_vector
from .kerple_log import EPS, uniform_heads
from .registry import register

P_MAX = 2.0


@register("kerple_power_ap_", "kerple_power__ap", "kerple_power_ap_ap", "kerple_power_original")
class KerplePower(PositionalScheme):
    takes_variant_name = True
    # Exponents live in [1e-2, 2], factors >= 1e-2; a variant has a subset of these.
    clamps = {"bias_p": (EPS, P_MAX), "bias_a": (EPS, None), "wei_p": (EPS, P_MAX), "wei_a": (EPS, None)}
    head_dims = {"bias_p": 0, "bias_a": 0, "wei_p": 0, "wei_a": 0}  # (H, 1, 1)

    def __init__(self, spec: PositionalSpec, name: str):
        super().__init__(spec)
        self.bias_p = self.bias_a = self.wei_p = self.wei_a = None
        if name.endswith("original"):
            # ALiBi slopes clamped at 1e-2 in forward, like the paper's code. With 12 heads the
            # slopes 2^-7 and 2^-8 are below 1e-2 and get raised, so this is NOT exact ALiBi.
            slopes = torch.tensor(alibi_slopes(spec.num_heads), dtype=torch.float32)
            self.bias_a = nn.Parameter(slopes[spec.head_slice].clone()[:, None, None],
                                       requires_grad=False)
        else:
            bias_arg, wei_arg = name.split("_")[-2:]
            # Draw order bias_p, bias_a, wei_p, wei_a as in the paper's code.
            self.bias_p = uniform_heads(spec, 2.0) if "p" in bias_arg else None
            self.bias_a = uniform_heads(spec, 1.0) if "a" in bias_arg else None
            self.wei_p = uniform_heads(spec, 2.0) if "p" in wei_arg else None
            self.wei_a = uniform_heads(spec, 1.0) if "a" in wei_arg else None

    def fused_kernel(self) -> DistanceKernel:
        c = self.clamped()  # bias -a_b * d**p_b, weight exp(-a_w * d**p_w)
        return DistanceKernel(
            bias="power" if {"bias_p", "bias_a"} & c.keys() else "none",
            r2=heads_vector(c.get("bias_a")), r3=heads_vector(c.get("bias_p")),
            has_weight=bool({"wei_p", "wei_a"} & c.keys()),
            w_a=heads_vector(c.get("wei_a")), w_p=heads_vector(c.get("wei_p")))
