"""How a scheme describes its score hooks to fused attention kernels (triton, flex).

A fused kernel never materialises [H, Lq, Lk]: it evaluates the bias and weight on the fly from
the distance d = q_pos - k_pos >= 0 and a few per-head numbers. A scheme opts in by returning a
DistanceKernel from `fused_kernel()`; schemes without score hooks get `DistanceKernel.plain()`
from the base class, and a score-hook scheme that does not override it is refused by the fused
backends with a reason (the reference and SDPA backends still run it).

    bias kinds ("bias"):
        none    bias = 0
        log     bias = -r1 * log(1 + r2 * d**r3)        kerple_log (r3 = None: exponent 1), 3-para-log
        power   bias = -r2 * d**r3                      kerple_power (r2/r3 None: 1), alibi, original
        lookup  bias = values[h, min(d, max_distance)]  rpe (T5 buckets); values = table[bucket] * scale
    weight (multiplies the scaled scores before the bias is added):
        weight = exp(-w_a * d**w_p)  (w_a / w_p None: 1)  kerple_power_*_ap ("bias+wht")

Every tensor is float32 with shape (H_local,) except `table` (num_buckets, H_local) and the
lookup helpers; they are the scheme's CLAMPED values, still attached to autograd (the clamps are
straight-through), so a fused kernel that returns their gradients trains the raw parameters.
d**p is defined as 0 at d = 0 for every p (pow_distance in base.py)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

BIAS_KINDS = ("none", "log", "power", "lookup")


@dataclass
class DistanceKernel:
    bias: str = "none"
    r1: torch.Tensor | None = None
    r2: torch.Tensor | None = None
    r3: torch.Tensor | None = None
    w_a: torch.Tensor | None = None
    w_p: torch.Tensor | None = None
    has_weight: bool = False
    # lookup (T5 buckets): bias = table[bucket_of[min(d, max_distance)], h] * table_scale
    table: torch.Tensor | None = None  # (num_buckets, H_local) learned
    bucket_of: torch.Tensor | None = None  # (max_distance + 1,) int64 bucket id per distance
    table_scale: float = 1.0

    def __post_init__(self):
        if self.bias not in BIAS_KINDS:
            raise ValueError(f"unknown fused bias kind {self.bias!r}; one of {BIAS_KINDS}")
        if self.bias == "lookup" and (self.table is None or self.bucket_of is None):
            raise ValueError("a lookup bias needs table and bucket_of")

    @classmethod
    def plain(cls) -> DistanceKernel:
        """No bias and no weight (rotary, learned, sinusoidal, none)."""
        return cls()

    @property
    def is_plain(self) -> bool:
        return self.bias == "none" and not self.has_weight

    @property
    def max_distance(self) -> int:
        return 0 if self.bucket_of is None else self.bucket_of.numel() - 1

    def lookup_values(self) -> torch.Tensor:
        """(H_local, max_distance + 1) float32: the bias at every distance up to max_distance
        (larger distances use the last entry), differentiable w.r.t. the table."""
        return (self.table.float()[self.bucket_of] * self.table_scale).t().contiguous()

    def tensors(self) -> dict[str, torch.Tensor]:
        """The differentiable inputs by name (for autograd.Function plumbing and tests)."""
        names = ("r1", "r2", "r3", "w_a", "w_p", "table")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    # ---- the closed forms, in torch: what every fused kernel must reproduce ----------------
    def bias_at(self, d: torch.Tensor) -> torch.Tensor | None:
        """d: float32 (Lq, Lk) distances clamped at 0 -> (H, Lq, Lk) or None."""
        from megatron.positional.base import pow_distance

        if self.bias == "none":
            return None
        if self.bias == "lookup":
            idx = d.long().clamp_max(self.max_distance)
            return self.lookup_values()[:, idx]
        r1, r2, r3 = (_per_head(x) for x in (self.r1, self.r2, self.r3))
        x = pow_distance(d, r3) if r3 is not None else d[None]
        if self.bias == "log":
            return -r1 * torch.log1p(r2 * x)
        return -(r2 * x if r2 is not None else x)

    def weight_at(self, d: torch.Tensor) -> torch.Tensor | None:
        from megatron.positional.base import pow_distance

        if not self.has_weight:
            return None
        w_a, w_p = _per_head(self.w_a), _per_head(self.w_p)
        x = pow_distance(d, w_p) if w_p is not None else d[None]
        return torch.exp(-(w_a * x if w_a is not None else x))


def _per_head(x: torch.Tensor | None) -> torch.Tensor | None:
    return None if x is None else x[:, None, None]


def heads_vector(x: torch.Tensor | None) -> torch.Tensor | None:
    """A per-head parameter stored as (H, 1, 1) -> (H,) float32, keeping autograd."""
    return None if x is None else x.float().reshape(-1)
