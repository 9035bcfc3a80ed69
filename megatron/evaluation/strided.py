"""Sliding-window (strided) evaluation: every target is predicted once, with up to L-1 tokens of
context, by windows of L tokens that advance S tokens at a time and score only their last S
targets (the first window scores all of its targets). S = L is the non-overlapping evaluation.

This measures how well a model USES a context of length L at every position, whereas the paper's
non-overlapping windows mix short and long contexts (position 0 of each window has none).
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch
from tqdm import tqdm

from megatron.data.gpt_dataset import build_eval_windows
from megatron.evaluation.lengths import LengthResult, check_finite_losses
from megatron.evaluation.spread import ONE_PROCESS, EvalGroup


def stream_tokens(data_prefix, split, split_name, seed, num_targets, cache_dir=None, vocab_size=None) -> np.ndarray:
    """The first num_targets+1 tokens of the split's (seeded, shuffled) document stream."""
    chunk = min(num_targets, 4096)
    ds = build_eval_windows(data_prefix, split, split_name, chunk, seed,
                            max_windows=-(-num_targets // chunk), cache_dir=cache_dir, vocab_size=vocab_size)
    pieces = [ds[0]["text"]] + [ds[i]["text"][1:] for i in range(1, len(ds))]  # windows share one token
    tokens = np.concatenate(pieces)
    return tokens[: num_targets + 1]


def strided_windows(num_targets: int, length: int, stride: int) -> list[tuple[int, int, int]]:
    """(start, end, first_scored) per window over targets [0, num_targets): the window feeds
    tokens[start:end] and scores targets [first_scored, end)."""
    if not 1 <= stride <= length:
        raise ValueError(f"stride {stride} must be between 1 and the window length {length}")
    out, scored = [], 0
    while scored < num_targets:
        end = min(scored + stride, num_targets) if scored else min(length, num_targets)
        out.append((max(0, end - length), end, scored))
        scored = end
    return out


@torch.no_grad()
def evaluate_strided(model, data_prefix, split, split_name, length: int, stride: int, seed: int,
                     max_tokens: int, device="cpu", cache_dir=None, progress=True,
                     group: EvalGroup = ONE_PROCESS) -> LengthResult:
    """group: the ranks sharing the windows (each scores its part, the sums are merged: spread.py)."""
    start_time = time.perf_counter()

    def score() -> tuple[np.ndarray, int]:  # this rank's windows; inside the agreement, the data reading too
        vocab_size = getattr(model, "vocab_size", None)  # a token id beyond it: DataError naming the file
        tokens = torch.from_numpy(stream_tokens(data_prefix, split, split_name, seed, max_tokens, cache_dir,
                                                vocab_size).astype(np.int64))
        windows = strided_windows(tokens.numel() - 1, length, stride)
        part = group.part(len(windows))
        total, count = 0.0, 0
        for i in tqdm(part, desc=f"strided L={length} S={stride}", leave=False, disable=not progress or None):
            start, end, first = windows[i]
            inp = tokens[start:end].unsqueeze(0).to(device)
            lab = tokens[start + 1 : end + 1].unsqueeze(0).to(device)
            losses = model.token_losses(inp, lab)[0, first - start :]  # only the new targets
            check_finite_losses(model, losses, length, f"strided window {i + 1} (targets {first}-{end - 1}, "
                                f"stride {stride})", offset=first - start)
            total += float(losses.double().sum())
            count += losses.numel()
        return np.array([total, count], dtype=np.float64), len(part)

    (total, count), per_rank = group.sum_parts(score)
    loss = total / max(count, 1)
    return LengthResult(length, loss, math.exp(min(loss, 700.0)), sum(per_rank), int(count),
                        time.perf_counter() - start_time, np.array([loss]),
                        windows_per_rank=per_rank if group.world_size > 1 else None)
