"""How the harness adapter batches what it scores and generates: padded batches.

Scoring (`score_continuations`): requests sorted by input length, longest first (an out-of-memory
error shows on the first batch, not after hours; and rows of a batch have similar lengths, so
little is padding), in chunks of `batch_size`, padded on the RIGHT. Causal attention never looks
ahead, so each row's real tokens get exactly what they get alone; only their positions are read.

Generation (`generate`): prompts in chunks of `batch_size`, padded on the LEFT (so every row's
next token sits in the last column) with the model's `row_starts` (megatron/attention/mask.py:
padding hidden, each row at its own positions), then one token per step for the whole chunk
through the kv-cache. A row that has stopped is fed its last token until the chunk is done; its
output is already final. Greedy results equal generating each prompt alone (the padding tests).
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from megatron.evaluation.lengths import NonFiniteLoss
from megatron.generation import decode

Request = tuple[list[int], list[int]]  # (input tokens, targets): the last len(targets) inputs predict them
PAD_ID = 0  # any id: padding is never attended to by a real token, and its outputs are never read


def length_sorted_batches(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Indices 0..n-1 in chunks of batch_size, longest first (stable among equal lengths)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[s : s + batch_size] for s in range(0, len(order), batch_size)]


@torch.no_grad()
def _score_batch(model, rows: list[Request], device) -> list[tuple[float, bool]]:
    """(sum of log p(target), every target the argmax) per row, the rows padded on the right.
    Log-softmax over the model's whole (padded) vocabulary in float32, as its training loss and
    the harness's `hf` model on our export do."""
    width = max(len(inputs) for inputs, _ in rows)
    tokens = torch.full((len(rows), width), PAD_ID, dtype=torch.long, device=device)
    for b, (inputs, _) in enumerate(rows):
        tokens[b, : len(inputs)] = torch.tensor(inputs, dtype=torch.long)
    n = max(len(targets) for _, targets in rows)
    # Row b's targets are predicted by its last len(targets) real positions; gather n positions
    # per row (the first n - len(targets) of them are not read).
    pick = torch.stack([torch.arange(len(i) - n, len(i)).clamp_min(0) for i, _ in rows]).to(device)  # (B, n)
    hidden = model.hidden_states(tokens)
    if not bool(torch.isfinite(hidden).all()):  # lm-eval would rank NaN log-likelihoods silently
        raise NonFiniteLoss(f"the model's outputs are not finite on a batch of inputs of up to {width} tokens: "
                            "its computation overflows at this length and the task scores would be meaningless; "
                            "lower --max-length")
    hidden = hidden.gather(1, pick[:, :, None].expand(-1, -1, hidden.shape[-1]))  # (B, n, h)
    logprobs = model.logits(hidden)
    logprobs = torch.log_softmax(logprobs.float(), dim=-1)
    out = []
    for row, (_, targets) in zip(logprobs, rows):
        lp = row[n - len(targets):]
        want = torch.tensor(targets, dtype=torch.long, device=lp.device)
        out.append((float(lp.gather(-1, want[:, None]).sum()), bool((lp.argmax(-1) == want).all())))
    return out


def score_continuations(model, requests: list[Request], batch_size: int = 1, device=None,
                        progress=None) -> list[tuple[float, bool]]:
    """(log-likelihood, is_greedy) of each request's targets, in the order given.
    `progress(n)` is called after each batch with the number of requests it scored."""
    device = device if device is not None else next(model.parameters()).device
    out: list[tuple[float, bool] | None] = [None] * len(requests)
    for batch in length_sorted_batches([len(inputs) for inputs, _ in requests], batch_size):
        for i, res in zip(batch, _score_batch(model, [requests[i] for i in batch], device)):
            out[i] = res
        if progress is not None:
            progress(len(batch))
    return out


@torch.no_grad()
def _generate_batch(model, prompts: list[list[int]], budgets: list[int], stop: Callable, sample, device):
    width = max(len(p) for p in prompts)
    tokens = torch.full((len(prompts), width), PAD_ID, dtype=torch.long, device=device)
    for b, p in enumerate(prompts):
        tokens[b, width - len(p):] = torch.tensor(p, dtype=torch.long)
    starts = torch.tensor([width - len(p) for p in prompts], dtype=torch.long, device=device)
    cache = model.new_cache()
    new: list[list[int]] = [[] for _ in prompts]
    done = [budget < 1 for budget in budgets]
    if all(done):
        return new
    first = model(tokens, cache=cache, row_starts=starts)[:, -1].float()  # (B, V); the cache keeps the starts
    forward = lambda step: model(step, cache=cache)[:, -1].float()
    for nxt in decode(first, forward, (lambda logits: logits.argmax(-1)) if sample is None else sample):
        for b, t in enumerate(nxt.tolist()):
            if not done[b]:
                new[b].append(t)
                done[b] = len(new[b]) >= budgets[b] or stop(new[b])
        if all(done):
            break
    return new


def generate(model, prompts: list[list[int]], max_new_tokens: list[int], stop: Callable, sample=None,
             device=None, progress=None, batch_size: int = 1) -> list[list[int]]:
    """Continue each prompt with the kv-cache until `stop(new_ids)` is true or max_new_tokens[i]
    tokens are out; returns the new ids, in the order given. Greedy unless `sample(logits (B, V))
    -> (B,) ids` is given. Prompts run `batch_size` at a time, left-padded (module docstring)."""
    device = device if device is not None else next(model.parameters()).device
    out: list[list[int] | None] = [None] * len(prompts)
    for batch in length_sorted_batches([len(p) for p in prompts], batch_size):
        got = _generate_batch(model, [prompts[i] for i in batch], [max_new_tokens[i] for i in batch], stop,
                              sample, device)
        for i, ids in zip(batch, got):
            out[i] = ids
        if progress is not None:
            progress(len(batch))
    return out
