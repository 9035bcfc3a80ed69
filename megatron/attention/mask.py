"""The one causal / sliding-window mask every backend uses, its window check, and the one test
for "positions are consecutive runs" that the fused backends and SDPA's built-in causal path need."""
from __future__ import annotations

import torch


def check_window(window: int | None) -> None:
    """Raise the shared message unless window is None or an integer >= 1."""
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"attention window must be an integer >= 1 (the number of keys each query "
                         f"sees, itself included) or None for full causal attention; got {window!r}")


def allowed_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """Bool (Lq, Lk): True where query i may attend to key j.

    Causal: k_pos[j] <= q_pos[i]. With a window W >= 1 also q_pos[i] - k_pos[j] < W, i.e. query i
    sees keys i-W < j <= i: exactly W keys including itself (window=1 keeps only the diagonal).
    NeoX's sliding_window_width W keeps j in [i-W, i], i.e. W+1 keys: pass W+1 here to match it.
    Positions are absolute, so kv-cache rows (q_pos = the last positions) need no special case.
    """
    check_window(window)
    diff = q_pos[:, None] - k_pos[None, :]  # (Lq, Lk) int64
    allowed = diff >= 0
    if window is not None:
        allowed = allowed & (diff < window)
    return allowed


def consecutive_starts(q_pos: torch.Tensor, k_pos: torch.Tensor) -> tuple[int, int] | None:
    """(q0, k0) when q_pos = q0 + arange(Lq) and k_pos = k0 + arange(Lk), else None (also when
    either is empty). One host sync. Training and kv-cache decoding both give consecutive runs."""
    if q_pos.numel() == 0 or k_pos.numel() == 0:
        return None

    def steps_ok(pos):
        return (pos[1:] - pos[:-1] == 1).all()

    q0, k0, q_ok, k_ok = torch.stack([q_pos[0], k_pos[0], steps_ok(q_pos), steps_ok(k_pos)]).tolist()
    return (q0, k0) if q_ok and k_ok else None
