"""Distances between query and key positions: the leaf every distance-based formula starts from,
and the positions the model makes itself, known on the host (position_run).

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


# ---- positions known on the host --------------------------------------------------------------
# Training and kv-cache decoding take consecutive positions (start + arange(L)) that the model
# itself makes. Made by `position_run`, a tensor carries its start, so the layout check
# (attention/mask.py consecutive_starts), a table's cover and a bounds check answer without
# reading the device: on a GPU each read is a host sync that stops the CPU from
# queueing the next kernels (one per forward in every training step, several per decoded token).
# An in-place change of the tensor bumps its version counter and the mark no longer counts.
_RUN_MARK = "_kerple_position_run"


def position_run(start: int, length: int, device) -> torch.Tensor:
    """(length,) int64 positions start .. start + length - 1 on `device`, known on the host."""
    pos = torch.arange(start, start + length, device=device)
    if not pos.is_inference():  # an inference-mode tensor has no version counter to check
        setattr(pos, _RUN_MARK, (start, pos._version))
    return pos


def run_start(pos: torch.Tensor) -> int | None:
    """The first position of a tensor `position_run` made (and nothing changed since), else None.
    Never reads the device."""
    mark = getattr(pos, _RUN_MARK, None)
    if mark is None or pos.is_inference() or pos._version != mark[1]:
        return None
    return mark[0]


def largest_distance(q_pos: torch.Tensor, k_pos: torch.Tensor) -> int | None:
    """max(q - k, 0) over every query/key pair when both are known runs (no device read), else None."""
    q0, k0 = run_start(q_pos), run_start(k_pos)
    if q0 is None or k0 is None or q_pos.numel() == 0 or k_pos.numel() == 0:
        return None
    return max(q0 + q_pos.numel() - 1 - k0, 0)


def run_slice(pos: torch.Tensor, index) -> torch.Tensor:
    """pos[..., index] (the last dim: rows at their own positions are (B, L)), still known on the
    host when `pos` is a known run and `index` a slice of step 1 (a slice of a run is a run). The
    whole tensor itself for slice(None)."""
    if index == slice(None):
        return pos
    start = run_start(pos)
    if start is None or not isinstance(index, slice) or index.step not in (None, 1):
        return pos[..., index]
    first, stop, _ = index.indices(pos.numel())
    return position_run(start + first, max(stop - first, 0), pos.device)


# ---- positions a training recipe drew ----------------------------------------------------------
# Randomized positions and PoSE (megatron/data/position_recipes.py) hand the model sorted positions
# with gaps. The mark says so without reading the device, so the backend is resolved for them
# (the fused kernels index consecutive positions and refuse them by name) before any kernel runs.
_SAMPLED_MARK = "_kerple_sampled_positions"


def sampled_positions(pos: torch.Tensor) -> torch.Tensor:
    """`pos` marked as positions a training recipe drew (gapped, sorted)."""
    setattr(pos, _SAMPLED_MARK, True)
    return pos


def is_sampled(pos: torch.Tensor | None) -> bool:
    """Whether `pos` carries sampled_positions' mark."""
    return pos is not None and getattr(pos, _SAMPLED_MARK, False)
