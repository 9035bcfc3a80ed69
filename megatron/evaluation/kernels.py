"""The learned positional kernel f_h(d) of every head, read from a checkpoint (paper Figs. 2-4).

Works for any score-bias scheme without naming it: the scheme's own `score_bias(q_pos, k_pos)`
hook is evaluated for one query at position max_d against keys 0..max_d, so f_h(d) is exactly
what attention adds at distance d = max_d - k (KERPLE log/power, ALiBi, T5 buckets, 3-para ...).
Schemes without a score bias (rotary, learned, ...) have no such kernel: None. A scheme whose bias
depends on the query position as well (`shift_invariant` False: FIRE) is also read at a few
query positions i, each against keys 0..i ("by_query").
"""
from __future__ import annotations

import numpy as np
import torch

from megatron.checkpoint.load_model import load_checkpoint_model


def kernel_of_scheme(position, max_distance: int) -> np.ndarray | None:
    """f[h, d] for d in 0..max_distance, float64 numpy [H_local, max_distance + 1]; None without a bias."""
    if max_distance < 0:
        raise ValueError(f"max_distance must be >= 0, got {max_distance}")
    q_pos = torch.tensor([max_distance], dtype=torch.long)
    k_pos = torch.arange(max_distance + 1, dtype=torch.long)
    with torch.no_grad():
        bias = position.score_bias(q_pos, k_pos)  # (H, 1, max_d + 1), key j at distance max_d - j
    if bias is None:
        return None
    return bias[:, 0, :].flip(-1).double().cpu().numpy()


def query_positions(max_distance: int) -> list[int]:
    """The query positions a query-dependent kernel is plotted at: max_d / 4, max_d / 2, max_d."""
    return sorted({max(1, max_distance // 4), max(1, max_distance // 2), max_distance})


def learned_kernels(checkpoint_dir: str, max_distance: int, tag: str | None = None) -> dict | None:
    """{"scheme", "checkpoint", "iteration", "distance" [D+1], "kernel" [H, D+1]}, or None (no score bias).
    A query-dependent scheme adds "by_query": {query position i: [H, i+1] (f at d = 0..i)}."""
    model, cfg, client = load_checkpoint_model(checkpoint_dir, tag)
    kernel = kernel_of_scheme(model.position, max_distance)
    if kernel is None:
        return None
    out = {"scheme": cfg.model.pos_emb, "checkpoint": checkpoint_dir, "iteration": client.get("iteration"),
           "distance": np.arange(max_distance + 1), "kernel": kernel}
    if not model.position.shift_invariant:
        out["by_query"] = {i: kernel_of_scheme(model.position, i) for i in query_positions(max_distance)}
    return out
