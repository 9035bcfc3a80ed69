"""Distances between query and key positions: the leaf every distance-based formula starts from.

Imports nothing of ours, so the scheme contract (base.py) and the formula description
(distance_kernel.py) can both use it without importing each other."""
from __future__ import annotations

import torch


def causal_distance(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """d[i, j] = max(q_pos[i] - k_pos[j], 0) in float32: [Lq, Lk].

    Clamping at 0 keeps log/pow finite on the masked upper triangle (else log1p(a*d) with
    d < -1/a is NaN and 0*NaN poisons the parameter gradients)."""
    d = q_pos[:, None].to(torch.float32) - k_pos[None, :].to(torch.float32)
    return d.clamp_min(0.0)


def pow_distance(d: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """d ** p for d >= 0 with d ** p = 0 at d = 0 and a finite gradient for p everywhere.

    d/dp d^p = d^p * log(d) is 0 * -inf = NaN at d = 0 when written naively; PyTorch's pow
    masks that case but a hand-written kernel may not, so the guard is explicit here."""
    positive = d > 0
    d_safe = torch.where(positive, d, torch.ones_like(d))  # log(1) = 0 keeps the dead branch finite
    return torch.where(positive, torch.exp(p * torch.log(d_safe)), torch.zeros_like(d_safe * p))
