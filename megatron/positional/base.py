"""The contract every positional scheme implements.

A scheme is one nn.Module instance shared by all layers (as in the KERPLE paper). The attention
core calls the same four hooks on every scheme and never compares scheme names:

    embed(positions)             -> [L, hidden] added to token embeddings, or None
    rotate_qk(q, k, q_pos, k_pos) -> (q, k) rotated, or unchanged
    score_bias(q_pos, k_pos)     -> [H_local, Lq, Lk] float32 added to the scaled scores, or None
    score_weight(q_pos, k_pos)   -> [H_local, Lq, Lk] float32 multiplying the scaled scores, or None

The bias is added AFTER the 1/sqrt(head_dim) scaling and before mask/softmax (the placement
the paper's released checkpoints depend on). Positions are absolute int64 token indices, so the
same hooks serve training, evaluation at any length and kv-cache decoding (q_pos = the new rows).
For causal attention only j <= i matters; schemes must nevertheless return finite values on the
masked upper triangle (distances are clamped at 0) so gradients through the mask stay NaN-free.

Tensor parallelism: heads are split contiguously; rank r owns heads [r*H/tp, (r+1)*H/tp). A
scheme built with (tp_rank, tp_size) holds ONLY its own heads, and its parameters are initialised
from the full-H draw then sliced, so TP=2 and TP=1 start identical.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class PositionalSpec:
    """Everything a scheme may need to build itself (taken from the model config)."""

    num_heads: int  # global number of attention heads
    head_dim: int
    hidden_size: int
    max_position_embeddings: int
    rotary_pct: float = 1.0
    rotary_emb_base: int = 10000
    rpe_num_buckets: int = 32
    rpe_max_distance: int = 128
    tp_rank: int = 0
    tp_size: int = 1
    init_method_std: float = 0.02

    @property
    def local_heads(self) -> int:
        return self.num_heads // self.tp_size

    @property
    def head_slice(self) -> slice:
        n = self.local_heads
        return slice(self.tp_rank * n, (self.tp_rank + 1) * n)


class PositionalScheme(nn.Module):
    """Base class: every hook is a no-op; a scheme overrides the ones it uses."""

    name: str = "base"
    # True when the scheme is meant to be evaluated beyond the train length.
    extrapolates: bool = True
    # Upper bound on the sequence length the scheme can represent (None = any length).
    def max_length(self) -> int | None:
        return None

    has_score_bias: bool = False
    has_score_weight: bool = False

    def __init__(self, spec: PositionalSpec):
        super().__init__()
        self.spec = spec

    def embed(self, positions: torch.Tensor) -> torch.Tensor | None:
        return None

    def rotate_qk(self, q, k, q_pos, k_pos):
        # q: (B, H, Lq, D), k: (B, H, Lk, D)
        return q, k

    def score_bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        return None

    def score_weight(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        return None

    def fused_kernel(self):
        """The scheme's bias/weight as a megatron.positional.fused.DistanceKernel for fused
        attention kernels, or None when it has score hooks they cannot express."""
        from megatron.positional.fused import DistanceKernel

        if not self.has_score_bias and not self.has_score_weight:
            return DistanceKernel.plain()
        return None

    def stats(self) -> dict[str, float]:
        """Scalars logged every step (the paper logs bias_p_mean, bias_p_std, ... for KERPLE)."""
        return {}


def causal_distance(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """d[i, j] = max(q_pos[i] - k_pos[j], 0) in float32: [Lq, Lk].

    Clamping at 0 keeps log/pow finite on the masked upper triangle (else log1p(a*d) with
    d < -1/a is NaN and 0*NaN poisons the parameter gradients)."""
    d = q_pos[:, None].to(torch.float32) - k_pos[None, :].to(torch.float32)
    return d.clamp_min(0.0)


def clamp_straight_through(x: torch.Tensor, min: float | None = None, max: float | None = None):
    """Forward uses clamp(x); backward passes the gradient straight through as identity.

    This is what the paper's code does by clamping `.data` outside autograd, but without
    mutating the stored parameter (so optimizer state and checkpoints see the raw value)."""
    return x + (x.clamp(min=min, max=max) - x).detach()


def pow_distance(d: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """d ** p for d >= 0 with d ** p = 0 at d = 0 and a finite gradient for p everywhere.

    d/dp d^p = d^p * log(d) is 0 * -inf = NaN at d = 0 when written naively; PyTorch's pow
    masks that case but a hand-written kernel may not, so the guard is explicit here."""
    positive = d > 0
    d_safe = torch.where(positive, d, torch.ones_like(d))  # log(1) = 0 keeps the dead branch finite
    return torch.where(positive, torch.exp(p * torch.log(d_safe)), torch.zeros_like(d_safe * p))


def summary_stats(name: str, x: torch.Tensor) -> dict[str, float]:
    """{name_mean, name_std, name_max, name_min} over the heads, as python floats (paper's keys).

    std is the unbiased estimate like torch's default; with a single head it is reported as 0."""
    x = x.detach().float().flatten()
    std = x.std().item() if x.numel() > 1 else 0.0
    return {f"{name}_mean": x.mean().item(), f"{name}_std": std,
            f"{name}_max": x.max().item(), f"{name}_min": x.min().item()}
