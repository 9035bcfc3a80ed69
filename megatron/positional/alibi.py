"""ALiBi (Press et al.): bias = -slope_h * (i - j) with the standard geometric slopes.

The bias is computed from the positions on every call (one multiply), never cached as an
[H, L, L] matrix, so evaluation at 16k tokens costs no persistent memory."""
from __future__ import annotations

import math

import torch

from .base import PositionalScheme, PositionalSpec
from .distance_kernel import DistanceKernel, heads_vector
from .registry import register


def alibi_slopes(n: int) -> list[float]:
    """The ALiBi paper's slopes for n heads (all n heads; slice for tensor parallelism)."""
    def power_of_2(m: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(m) - 3)))  # 2^(-8/m)
        return [start * start**i for i in range(m)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    # Not a power of 2: the closest lower power's slopes, then every other slope of twice that.
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + alibi_slopes(2 * closest)[0::2][: n - closest]


@register("alibi")
class ALiBi(PositionalScheme):
    head_dims = {"slopes": 0}  # (H, 1, 1)

    def __init__(self, spec: PositionalSpec):
        super().__init__(spec)
        slopes = torch.tensor(alibi_slopes(spec.num_heads), dtype=torch.float32)[spec.head_slice]
        # Persistent: NeoX checkpoints carry `attention.alibi_embed.slopes`.
        self.register_buffer("slopes", slopes[:, None, None], persistent=True)  # (H_local, 1, 1)

    def fused_kernel(self) -> DistanceKernel:
        return DistanceKernel(bias="power", r2=heads_vector(self.slopes))  # -slope * d
