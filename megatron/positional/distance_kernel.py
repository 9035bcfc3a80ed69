"""A scheme's score bias and weight as a function of distance: the one description of its formula.

A scheme states its formula once, as the DistanceKernel its `fused_kernel()` returns: a bias kind
and a few per-head numbers, evaluated at the distance d = max(q_pos - k_pos, 0). Everything else
derives from it: the dense [H, Lq, Lk] hooks (PositionalScheme.score_bias / score_weight), flex's
score_mod, which evaluates it one score at a time and never materialises [H, Lq, Lk], and the
Hugging Face export, which ships this file. Schemes without score hooks return
`DistanceKernel.plain()`; a scheme whose bias no kind here expresses returns None and writes its
own score hooks, and the fused backends refuse it with a reason.

    bias kinds ("bias"):
        none    bias = 0
        log     bias = -r1 * log(1 + r2 * d**r3)        kerple_log (r3 = None: exponent 1), 3-para-log
        power   bias = -r2 * d**r3                      kerple_power (r2/r3 None: 1), alibi, original
        lookup  bias = values[h, min(d, max_distance)]  rpe (T5 buckets): values = table[bucket] * scale
                                                        sandwich: values = tabulate(n, device), a fixed
                                                        function of d tabulated out to the distance n
                                                        the caller needs (`covering`)
    weight (multiplies the scaled scores before the bias is added):
        weight = exp(-w_a * d**w_p)  (w_a / w_p None: 1)  kerple_power_*_ap ("bias+wht")

Every tensor is float32 with shape (H_local,) except `table` (num_buckets, H_local) and the
lookup helpers; they are the scheme's CLAMPED values, still attached to autograd (the clamps are
straight-through), so a fused kernel that returns their gradients trains the raw parameters.
d**p is defined as 0 at d = 0 for every p (pow_distance in distance.py)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .distance import pow_distance

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
    # lookup of a fixed (parameter-free) function of d whose values do not settle past any
    # distance (Sandwich): tabulate(n, device) -> (H_local, m + 1) float32, m >= n, its values at
    # d = 0..m. A kernel holds the table for `covered` distances; `covering(n, device)` extends it.
    tabulate: Callable[[int, torch.device], torch.Tensor] | None = None
    covered: torch.Tensor | None = None  # (H_local, m + 1): tabulate's last answer

    def __post_init__(self):
        if self.bias not in BIAS_KINDS:
            raise ValueError(f"unknown fused bias kind {self.bias!r}; one of {BIAS_KINDS}")
        learned = self.table is not None and self.bucket_of is not None
        if self.bias == "lookup" and learned == (self.tabulate is not None):
            raise ValueError("a lookup bias needs either table and bucket_of (learned) or tabulate (fixed)")
        # Built once here, not per element: flex's score_mod indexes it for every score.
        if self.bias != "lookup":
            self.values = None
        elif learned:
            self.values = (self.table.float()[self.bucket_of] * self.table_scale).t().contiguous()
        else:
            self.values = self.covered

    @classmethod
    def plain(cls) -> DistanceKernel:
        """No bias and no weight (rotary, learned, sinusoidal, none)."""
        return cls()

    @property
    def is_plain(self) -> bool:
        return self.bias == "none" and not self.has_weight

    @property
    def max_distance(self) -> int:
        if self.bucket_of is not None:
            return self.bucket_of.numel() - 1
        return -1 if self.values is None else self.values.shape[1] - 1

    @property
    def learned_table(self) -> bool:
        """A lookup whose table is a parameter (T5), as opposed to a fixed tabulated function."""
        return self.bias == "lookup" and self.tabulate is None

    def covering(self, n: int, device: torch.device) -> DistanceKernel:
        """This kernel with its lookup values valid for every distance 0..n on `device`. A T5
        table is valid at any distance already (every d >= max_distance is its last bucket); a
        tabulated one is extended. Callers that evaluate per element (flex's score_mod, the
        Triton kernel) call it with their largest distance first; the dense bias_at does itself."""
        if self.tabulate is None or (self.values is not None and n <= self.max_distance
                                     and self.values.device == torch.device(device)):
            return self
        return DistanceKernel(bias=self.bias, w_a=self.w_a, w_p=self.w_p, has_weight=self.has_weight,
                              tabulate=self.tabulate, covered=self.tabulate(max(n, 0), torch.device(device)))

    def lookup_values(self) -> torch.Tensor:
        """(H_local, max_distance + 1) float32: the bias at every distance up to max_distance
        (larger distances use the last entry: exact for T5; a tabulated kernel must be
        `covering` them), differentiable w.r.t. a learned table."""
        return self.values

    def tensors(self) -> dict[str, torch.Tensor]:
        """The differentiable inputs by name (for autograd.Function plumbing and tests)."""
        names = ("r1", "r2", "r3", "w_a", "w_p", "table")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    # ---- the closed forms: the one place the math is written -------------------------------
    # Every consumer evaluates these: the schemes' dense score_bias/score_weight (base.py), flex's
    # score_mod (one element per call), the HF export (it ships this file). The Triton kernels
    # (megatron/attention/kernels/distance_bias.py) restate them in-kernel and are tested against these.
    def bias_at(self, d: torch.Tensor, h: torch.Tensor | None = None,
                largest: int | None = None) -> torch.Tensor | None:
        """The bias at distances d (float32, clamped at 0), or None when there is none.

        Dense (h None): d is (Lq, Lk) and the result (H, Lq, Lk). Per element (h = a head index,
        as flex's score_mod calls it): d is one distance and the result one value. `largest`:
        max(d) when the caller knows it on the host (a tabulated lookup covers it without
        reading the device)."""
        if self.bias == "none":
            return None
        if self.bias == "lookup":
            if h is None and self.tabulate is not None:  # dense: cover the largest d (one sync unless given)
                if largest is None:
                    largest = int(d.max()) if d.numel() else 0
                kernel = self.covering(largest, d.device)
                return kernel.values[:, d.long()]  # (H, Lq, Lk)
            idx = d.long().clamp_max(self.max_distance)
            if h is not None:
                return self.values[h, idx]
            # Dense: the same table[bucket] * scale as `values`, gathered by embedding so the
            # table's gradient sums in the order NeoX's (and our earlier) code summed it.
            return F.embedding(self.bucket_of[idx], self.table.float()).permute(2, 0, 1) * self.table_scale
        if h is None:
            d = d[None]  # (1, Lq, Lk) against the (H, 1, 1) per-head values
        r1, r2, r3 = (_head(x, h) for x in (self.r1, self.r2, self.r3))
        x = _scaled(r2, pow_distance(d, r3) if r3 is not None else d)  # r2 * d**r3
        if self.bias == "log":
            x = _scaled(r1, torch.log1p(x))  # r1 * log(1 + r2 * d**r3)
        return -x

    def weight_at(self, d: torch.Tensor, h: torch.Tensor | None = None) -> torch.Tensor | None:
        """exp(-w_a * d**w_p), or None; d and h as in bias_at."""
        if not self.has_weight:
            return None
        if h is None:
            d = d[None]
        w_a, w_p = _head(self.w_a, h), _head(self.w_p, h)
        return torch.exp(-_scaled(w_a, pow_distance(d, w_p) if w_p is not None else d))


def _head(x: torch.Tensor | None, h: torch.Tensor | None) -> torch.Tensor | None:
    """A (H,) per-head value as (H, 1, 1) for the dense form, or head h's value."""
    if x is None:
        return None
    return x[:, None, None] if h is None else x[h]


def _scaled(a: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """a * x, where a missing factor is 1."""
    return x if a is None else a * x


def heads_vector(x: torch.Tensor | None) -> torch.Tensor | None:
    """A per-head parameter stored as (H, 1, 1) -> (H,) float32, keeping autograd."""
    return None if x is None else x.float().reshape(-1)
