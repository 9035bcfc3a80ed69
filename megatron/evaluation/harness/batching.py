"""How the harness adapter batches what it scores: the ONE place to change for padded batches.

Today GPTModel takes no key-padding mask, so a batch may only hold sequences of EQUAL length:
`score_continuations` groups the requests by input length and stacks each group in chunks of
`batch_size` (a batch of one length costs what one forward of that length costs; requests of
distinct lengths run one at a time, which on the harness's tasks is most of them).

Generation (`generate`) runs one prompt at a time through the kv-cache (megatron/model/kv_cache.py):
the prompt once, then one token per step.

Once the model takes an attention mask: for scoring, replace the grouping in `_equal_length_batches`
by length-sorted chunks padded on the right and pass the mask in `_score_batch`; for generation,
left-pad the prompts of a chunk in `generate`. The callers (adapter.py) do not change.
"""
from __future__ import annotations

from collections import defaultdict

import torch

Request = tuple[list[int], list[int]]  # (input tokens, targets): the last len(targets) inputs predict them


def _equal_length_batches(requests: list[Request], batch_size: int) -> list[list[int]]:
    """Indices of `requests`, grouped so every batch holds inputs of one length, longest first
    (an out-of-memory error shows on the first batch, not after hours)."""
    by_length = defaultdict(list)
    for i, (inputs, _) in enumerate(requests):
        by_length[len(inputs)].append(i)
    batches = []
    for length in sorted(by_length, reverse=True):
        group = by_length[length]
        batches += [group[s : s + batch_size] for s in range(0, len(group), batch_size)]
    return batches


@torch.no_grad()
def _score_batch(model, rows: list[Request], device) -> list[tuple[float, bool]]:
    """(sum of log p(target), every target the argmax) per row; rows share one input length.
    Log-softmax over the model's whole (padded) vocabulary in float32, as its training loss and
    the harness's `hf` model on our export do."""
    from megatron.model.linear import gather_logits, parallel_logits

    tokens = torch.tensor([inputs for inputs, _ in rows], dtype=torch.long, device=device)
    n = max(len(targets) for _, targets in rows)
    hidden = model.hidden_states(tokens)[:, -n:]  # only the rows that predict targets
    logprobs = gather_logits(parallel_logits(hidden, model.output_weight(), model.parallel), model.parallel)
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
    for batch in _equal_length_batches(requests, batch_size):
        for i, res in zip(batch, _score_batch(model, [requests[i] for i in batch], device)):
            out[i] = res
        if progress is not None:
            progress(len(batch))
    return out


@torch.no_grad()
def generate(model, prompts: list[list[int]], max_new_tokens: list[int], stop, sample=None, device=None,
             progress=None) -> list[list[int]]:
    """Continue each prompt with the kv-cache until `stop(new_ids)` is true or max_new_tokens[i]
    tokens are out; returns the new ids. Greedy unless `sample(logits (1, V)) -> (1,) ids` is given."""
    device = device if device is not None else next(model.parameters()).device
    out = []
    for prompt, budget in zip(prompts, max_new_tokens):
        cache = model.new_cache()
        step = torch.tensor([prompt], dtype=torch.long, device=device)
        new: list[int] = []
        while len(new) < budget:
            logits = model(step, cache=cache)[:, -1].float()
            nxt = logits.argmax(-1) if sample is None else sample(logits)
            new.append(int(nxt))
            if stop(new):
                break
            step = nxt.view(1, 1)
        out.append(new)
        if progress is not None:
            progress(1)
    return out
