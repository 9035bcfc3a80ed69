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


BUCKETS = Option("rpe_num_buckets", int, 32, "T5 relative-position buckets (pos-emb rpe).", ge=1)
MAX_DISTANCE = Option("rpe_max_distance", int, 128, "T5 relative-position max distance (pos-emb rpe).", ge=1)


def bucket_problems(num_buckets: int, max_distance: int) -> list[tuple[str, str]]:
    """Where T5's bucketing breaks: its log-spaced buckets run from max_exact = num_buckets // 2
    to max_distance, so both ends must exist and be apart (else it divides by log(1) or by 0, or
    far distances miss the last bucket). Held equal to rpe_bucket's own behaviour over a grid of
    pairs by tests/unit/test_rpe_rules.py."""
    if num_buckets < 2:
        return [("rpe_num_buckets", "must be >= 2 (half the buckets are exact distances, half log-spaced)")]
    if max_distance <= num_buckets // 2:
        return [("rpe_max_distance", f"must be > rpe-num-buckets // 2 ({num_buckets // 2}): the exact "
                 "buckets already cover that far, leaving the log-spaced ones no range")]
    return []


@register("rpe")
class RPE(PositionalScheme):
    head_dims = {"weight": 1}  # the T5 table (buckets, H)
    options = (BUCKETS, MAX_DISTANCE)

    def __init__(self, spec: PositionalSpec):
        super().__init__(spec)
        self.num_buckets, self.max_distance = self.option("rpe_num_buckets"), self.option("rpe_max_distance")
        # Every distance >= rpe_max_distance must fall in the last bucket: fused_kernel's table of
        # the buckets of 0..max_distance is then exact at any length.
        problems = bucket_problems(self.num_buckets, self.max_distance)
        if problems:  # a scheme built outside the config (tests, tools): the config's refusal
            raise ValueError("; ".join(f"{key.replace('_', '-')} {why}" for key, why in problems))
        # Init the full [buckets, H] table, then keep this rank's columns: TP=2 starts like TP=1.
        full = torch.empty(self.num_buckets, spec.num_heads)
        nn.init.xavier_normal_(full)
        self.weight = nn.Parameter(full[:, spec.head_slice].clone())  # (buckets, H_local)
        self.scale = math.sqrt(spec.head_dim)

    def fused_kernel(self) -> DistanceKernel:
        # bias = weight[bucket(d), h] * sqrt(head_dim), d's bucket exact up to max_distance and
        # the last one past it (checked in __init__).
        md, nb = self.max_distance, self.num_buckets
        bucket_of = rpe_bucket(torch.arange(md + 1, device=self.weight.device), nb, md)
        return DistanceKernel(bias="lookup", table=self.weight, bucket_of=bucket_of, table_scale=self.scale)

    @classmethod
    def option_problems(cls, values: dict) -> list[tuple[str, str]]:
        buckets, distance = BUCKETS.read(values), MAX_DISTANCE.read(values)
        if not (isinstance(buckets, int) and isinstance(distance, int)):
            return []  # a wrong type is refused by the key itself
        return bucket_problems(buckets, distance)
