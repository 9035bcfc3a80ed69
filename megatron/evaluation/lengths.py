"""Perplexity at many lengths in one process: the paper's extrapolation procedure.

For each length L, the split's shuffled, EOD-separated document stream is cut into
non-overlapping L+1-token windows (consecutive windows share one boundary token); the model sees
the first L tokens and is scored on all L next-token predictions. N = min(max_windows,
max_tokens // L) windows are asked for; which ones is the window order (windows.py: the
paper's shuffled sample order, or contiguous = the same leading N*L tokens at every length).
Both are reproducible from the data seed (it shuffles the documents, and the samples). A split
with fewer than N windows at L gives them all, once (NeoX would repeat the epoch); the result
records the count asked for beside the count scored.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm import tqdm

from megatron.data.gpt_dataset import build_eval_windows
from megatron.errors import UserError
from megatron.evaluation.blockwise import blockwise_causal_losses
from megatron.evaluation.spread import ONE_PROCESS, EvalGroup
from megatron.evaluation.windows import WINDOW_ORDERS


class NonFiniteLoss(UserError):
    """A NaN/inf token loss at evaluation: averaged, it would turn the length's result into nan
    (or hide among the others' means); the model overflowed at that length."""


def check_finite_losses(model, losses: torch.Tensor, length: int, where: str, offset: int = 0) -> None:
    """Raise NonFiniteLoss naming the length, the window (`where`) and the first bad position
    (in the window: `offset` + index in `losses`) unless every loss (B, l) is finite. One device
    sync per window."""
    bad = ~torch.isfinite(losses)
    if not bool(bad.any()):
        return
    first = offset + int(bad.nonzero()[0, -1])
    attn = getattr(getattr(model, "model_cfg", None), "attention_window", None)
    with_window = f" with attention-window {attn}" if attn else ""
    raise NonFiniteLoss(
        f"length {length}{with_window}: {int(bad.sum())} token losses are not finite in {where} (first at "
        f"position {first}); the weights are finite (checked on load), so the model's computation "
        f"overflows at this length and no average is reported. Drop {length} from --lengths, or "
        "evaluate it with --blockwise-causal or --window (shorter attention spans)")


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
    requested: int | None = None  # windows asked for (None: the whole split); `windows` may be fewer
    windows_per_rank: list[int] | None = None  # windows each rank scored (megatron/evaluation/spread.py)

    @property
    def short(self) -> bool:
        """Fewer windows scored than asked for (the split is too small at this length)."""
        return self.requested is not None and self.windows < self.requested


def evaluate_length(model, data_prefix: str, split: str, split_name: str, length: int, seed: int,
                    max_windows: int | None, max_tokens: int | None, batch_size: int = 1,
                    device="cpu", cache_dir: str | None = None, progress: bool = True,
                    window_order: str = "shuffled", blockwise_causal: int | None = None,
                    min_doc_tokens: int | None = None, group: EvalGroup = ONE_PROCESS) -> LengthResult:
    """blockwise_causal: score with blockwise causal attention of that block size (blockwise.py);
    min_doc_tokens: score only the split's documents of at least that many tokens; group: the
    ranks sharing the windows (each scores its part, the sums are merged: spread.py)."""
    if window_order not in WINDOW_ORDERS:
        raise ValueError(f"window order must be one of {', '.join(WINDOW_ORDERS)}, got {window_order!r}")
    limit = max_windows
    if max_tokens:
        limit = min(limit or 10**12, max(1, max_tokens // length))
    start = time.perf_counter()

    def score() -> tuple[np.ndarray, int]:  # this rank's windows; inside the agreement, the data reading too
        ds = build_eval_windows(data_prefix, split, split_name, length, seed, max_windows=limit, cache_dir=cache_dir,
                                stream_order=window_order == "contiguous", min_doc_tokens=min_doc_tokens,
                                vocab_size=getattr(model, "vocab_size", None))  # a bad id: DataError, not IndexError
        n, part = len(ds), group.part(len(ds))
        pos_sum = torch.zeros(length, dtype=torch.float64)
        bar = tqdm(total=len(part), desc=f"eval L={length}", leave=False, disable=not progress or None)
        for s in range(part.start, part.stop, batch_size):
            text = torch.from_numpy(np.stack([ds[i]["text"] for i in range(s, min(s + batch_size, part.stop))])
                                    .astype(np.int64))
            x, y = text[:, :-1].to(device), text[:, 1:].to(device)
            if blockwise_causal:
                losses = blockwise_causal_losses(model, x, y, blockwise_causal)  # (b, L)
            else:
                losses = model.token_losses(x, y)  # (b, L)
            check_finite_losses(model, losses, length, f"window {s + 1} of {n}" if text.shape[0] == 1
                                else f"windows {s + 1}-{s + text.shape[0]} of {n}")
            pos_sum += losses.double().sum(0).cpu()
            bar.update(text.shape[0])
        bar.close()
        return pos_sum.numpy(), len(part)

    pos_sum, per_rank = group.sum_parts(score)
    n = sum(per_rank)
    positionwise = pos_sum / max(n, 1)
    loss = float(positionwise.mean())
    return LengthResult(length, loss, math.exp(min(loss, 700.0)), n, n * length, time.perf_counter() - start,
                        positionwise, limit, per_rank if group.world_size > 1 else None)
