"""The one causal / sliding-window mask every backend uses."""
from __future__ import annotations

import torch


def allowed_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """Bool (Lq, Lk): True where query i may attend to key j.

    Causal: k_pos[j] <= q_pos[i]. With a window W >= 1 also q_pos[i] - k_pos[j] < W, i.e. query i
    sees keys i-W < j <= i: exactly W keys including itself (window=1 keeps only the diagonal).
    NeoX's sliding_window_width W keeps j in [i-W, i], i.e. W+1 keys: pass W+1 here to match it.
    Positions are absolute, so kv-cache rows (q_pos = the last positions) need no special case.
    """
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"attention window must be an integer >= 1 (the number of keys each query "
                         f"sees, itself included) or None for full causal attention; got {window!r}")
    diff = q_pos[:, None] - k_pos[None, :]  # (Lq, Lk) int64
    allowed = diff >= 0
    if window is not None:
        allowed = allowed & (diff < window)
    return allowed
