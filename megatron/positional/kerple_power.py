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

from megatron.positional.alibi import alibi_slopes
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

P_MAX = 2.0


@register("kerple_power_ap_", "kerple_power__ap", "kerple_power_ap_ap", "kerple_power_original")
class KerplePower(PositionalScheme):
    takes_variant_name = True

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
        # Instance attributes: which hooks are live depends on the variant.
        self.has_score_bias = self.bias_p is not None or self.bias_a is not None
        self.has_score_weight = self.wei_p is not None or self.wei_a is not None

    def clamped(self) -> dict[str, torch.Tensor]:
        """Every existing parameter, float32, clamped into its domain (straight-through)."""
        out = {}
        for name in ("bias_p", "bias_a", "wei_p", "wei_a"):
            x = getattr(self, name)
            if x is not None:
                hi = P_MAX if name.endswith("_p") else None
                out[name] = clamp_straight_through(x.float(), min=EPS, max=hi)
        return out

    @staticmethod
    def _kernel(d: torch.Tensor, p: torch.Tensor | None, a: torch.Tensor | None) -> torch.Tensor:
        """a * d^p, with p = 1 and a = 1 when absent: (H_local or 1, Lq, Lk)."""
        x = pow_distance(d, p) if p is not None else d[None]
        return a * x if a is not None else x

    def score_bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        if not self.has_score_bias:
            return None
        c = self.clamped()
        d = causal_distance(q_pos, k_pos)  # (Lq, Lk)
        return -self._kernel(d, c.get("bias_p"), c.get("bias_a"))  # (H_local, Lq, Lk)

    def score_weight(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        if not self.has_score_weight:
            return None
        c = self.clamped()
        d = causal_distance(q_pos, k_pos)  # (Lq, Lk)
        return torch.exp(-self._kernel(d, c.get("wei_p"), c.get("wei_a")))  # (H_local, Lq, Lk)

    def fused_kernel(self) -> DistanceKernel:
        c = self.clamped()
        return DistanceKernel(
            bias="power" if self.has_score_bias else "none",
            r2=heads_vector(c.get("bias_a")), r3=heads_vector(c.get("bias_p")),
            has_weight=self.has_score_weight,
            w_a=heads_vector(c.get("wei_a")), w_p=heads_vector(c.get("wei_p")))

    def stats(self) -> dict[str, float]:
        out = {}
        for name, value in self.clamped().items():
            out.update(summary_stats(name, value))
        return out
