"""Blockwise causal attention (BCA) for evaluation beyond the train length: the inference-time
attention of Sun et al., "A Length-Extrapolatable Transformer" (arXiv 2212.10554, section 3.3),
proposed with xPos and valid with every scheme.

The sequence is cut into blocks of B tokens (the paper: B = l/2, l the train length); a query
attends causally to its own block and to the whole previous block, i.e. query i sees keys j with
j <= i and floor(j / B) >= floor(i / B) - 1, so no query ever spans more than 2B = l positions.
As the paper computes it, keys and values of the previous block are reused: the blocks run one
after another through a kv-cache that keeps only the previous block's keys, which equals that
mask applied in every layer (a key's hidden state in layer k was itself computed under BCA). It
is not `attention-window` (a sliding window of exactly W keys per query): BCA's window grows from
B+1 to 2B keys inside each block."""
from __future__ import annotations

import torch

from megatron.model.kv_cache import KVCache


def check_block(block: int, train_length: int) -> int:
    """The block size for --blockwise-causal (0: the paper's train_length // 2)."""
    if block == 0:
        block = max(train_length // 2, 1)
    if block < 1:
        raise ValueError(f"--blockwise-causal {block} must be a positive block size (no value: train length / 2)")
    return block


@torch.no_grad()
def blockwise_causal_losses(model, tokens: torch.Tensor, labels: torch.Tensor, block: int) -> torch.Tensor:
    """Per-token cross entropy (B, L) float32 of `model` on tokens (B, L) under BCA with blocks of
    `block` tokens (see the module docstring)."""
    if model.model_cfg.attention_window is not None:
        raise ValueError("blockwise causal attention and attention-window are two masks: use one of them")
    cache = KVCache(len(model.layers))
    out = []
    for start in range(0, tokens.shape[1], block):
        cache.keep_from(start - block)  # the previous block's keys only
        out.append(model.token_losses(tokens[:, start:start + block], labels[:, start:start + block], cache=cache))
    return torch.cat(out, dim=1)
