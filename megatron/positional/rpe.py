"""Relative position bias, pos-emb "rpe" (T5's bucketed bias), as NeoX's
ParallelRelativePositionBias with causal=True.

Distance n = max(i - j, 0) goes to a bucket: n itself below max_exact = num_buckets // 2, then
log-spaced buckets up to rpe_max_distance, everything further in the last bucket. Each bucket has
one learned scalar per head; the bias is multiplied by sqrt(head_dim) as in NeoX (which adds it
to scores that were divided by sqrt(head_dim))."""
from __future__ import annotations

import math

import torch
from torch import nn

from .base import PositionalScheme, PositionalSpec
from .distance_kernel import DistanceKernel
from .options import Option
from .registry import register


def rpe_bucket(n: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """n: int64 distances >= 0 -> int64 bucket ids in [0, num_buckets)."""
    max_exact = num_buckets // 2
    # clamp_min keeps log finite where the small branch is taken anyway
    n_large = n.clamp_min(max_exact).to(torch.float32)
    val_if_large = max_exact + (
        torch.log(n_large / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).to(torch.long)  # truncation = floor for these non-negative values, as in NeoX
    val_if_large = val_if_large.clamp_max(num_buckets - 1)
    return torch.where(n < max_exact, n, val_if_large)


@register("rpe")
class RPE(PositionalScheme):
    head_dims = {"weight": 1}  # the T5 table (buckets, H)
    options = (Option("rpe_num_buckets", int, 32, "T5 relative-position buckets (pos-emb rpe).", ge=1),
               Option("rpe_max_distance", int, 128, "T5 relative-position max distance (pos-emb rpe).", ge=1))

    def __init__(self, spec: PositionalSpec):
        super().__init__(spec)
        self.num_buckets, self.max_distance = self.option("rpe_num_buckets"), self.option("rpe_max_distance")
        # Init the full [buckets, H] table, then keep this rank's columns: TP=2 starts like TP=1.
        full = torch.empty(self.num_buckets, spec.num_heads)
        nn.init.xavier_normal_(full)
        self.weight = nn.Parameter(full[:, spec.head_slice].clone())  # (buckets, H_local)
        self.scale = math.sqrt(spec.head_dim)

    def fused_kernel(self) -> DistanceKernel:
        # bias = weight[bucket(d), h] * sqrt(head_dim). Every distance >= rpe_max_distance falls
        # in the last bucket, so a table of the buckets of 0..max_distance is exact at any length
        # (checked here, not assumed).
        md, nb = self.max_distance, self.num_buckets
        n = torch.arange(md + 1, device=self.weight.device)
        bucket_of = rpe_bucket(n, nb, md)
        far = rpe_bucket(torch.tensor([md, 4 * md, 1 << 40]), nb, md)
        assert bool((far == nb - 1).all()), "T5 buckets past max_distance are not the last bucket"
        return DistanceKernel(bias="lookup", table=self.weight, bucket_of=bucket_of, table_scale=self.scale)
