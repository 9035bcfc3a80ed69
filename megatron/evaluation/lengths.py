"""Perplexity at many lengths in one process: the paper's extrapolation procedure.

For each length L, the split's shuffled, EOD-separated document stream is cut into
non-overlapping L+1-token windows (consecutive windows share one boundary token); the model sees
the first L tokens and is scored on all L next-token predictions. Every length is evaluated on
the first N windows of the same stream, N = min(max_windows, max_tokens // L, available).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm import tqdm

from megatron.data.gpt_dataset import build_eval_windows


def default_lengths(train_length: int, max_factor: int = 32) -> list[int]:
    """1x, 2x, 4x, ... max_factor x the train length."""
    out, f = [], 1
    while f <= max_factor:
        out.append(train_length * f)
        f *= 2
    return out


@dataclass
class LengthResult:
    length: int
    loss: float
    ppl: float
    windows: int
    tokens: int
    seconds: float
    positionwise: np.ndarray = field(repr=False)  # (L,) mean loss at each position


def evaluate_length(model, data_prefix: str, split: str, split_name: str, length: int, seed: int,
                    max_windows: int | None, max_tokens: int | None, batch_size: int = 1,
                    device="cpu", cache_dir: str | None = None, progress: bool = True) -> LengthResult:
    limit = max_windows
    if max_tokens:
        limit = min(limit or 10**12, max(1, max_tokens // length))
    ds = build_eval_windows(data_prefix, split, split_name, length, seed, max_windows=limit, cache_dir=cache_dir,
                            vocab_size=getattr(model, "vocab_size", None))  # a bad id: DataError, not IndexError
    start = time.perf_counter()
    pos_sum = torch.zeros(length, dtype=torch.float64)
    n = len(ds)
    bar = tqdm(total=n, desc=f"eval L={length}", leave=False, disable=not progress or None)
    for s in range(0, n, batch_size):
        text = torch.from_numpy(np.stack([ds[i]["text"] for i in range(s, min(s + batch_size, n))]).astype(np.int64))
        losses = model.token_losses(text[:, :-1].to(device), text[:, 1:].to(device))  # (b, L)
        pos_sum += losses.double().sum(0).cpu()
        bar.update(text.shape[0])
    bar.close()
    positionwise = (pos_sum / max(n, 1)).numpy()
    loss = float(positionwise.mean())
    return LengthResult(length, loss, math.exp(min(loss, 700.0)), n, n * length,
                        time.perf_counter() - start, positionwise)
