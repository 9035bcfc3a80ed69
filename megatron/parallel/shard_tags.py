"""Which dim of a tensor is split over the tensor-parallel ranks, written on the tensor itself.

The code that decides a split tags the tensors it creates, at every TP degree (TP=1 included, so
a single-rank model carries the same tags as its TP shards):

    megatron/model/linear.py    column_parallel: weight, bias 0; row_parallel: weight 1, bias
                                REPLICATED; vocab_parallel_embedding: weight 0
    megatron/model/norms.py     every norm: REPLICATED (`replicated` below)
    megatron/model/gpt.py       the positional scheme's tensors (positional_shards.py reads the
                                split off the scheme itself)

The checkpoint merge (merge.py) reads the tags off a model built on the meta device from the
checkpoint's config, so a tensor nobody tagged is an error naming it, never a guess.

Tags are attributes of the tensor objects: read them off a freshly built model (a buffer moved
with .to() is a new tensor without its tag; parameters keep theirs).
"""
from __future__ import annotations

import torch
from torch import nn

SHARD_DIM_ATTR = "tp_shard_dim"
REPLICATED = None  # the tag of a tensor every rank holds whole (the merge keeps rank 0's, checked equal)


def tag_shard_dim(t: torch.Tensor, dim: int | None) -> None:
    """Say that `t` is split along `dim` over the TP ranks (REPLICATED: not split)."""
    setattr(t, SHARD_DIM_ATTR, dim)


def shard_dim(t: torch.Tensor) -> int | None:
    """The dim `t` is tagged as split along (REPLICATED: not split); AttributeError if untagged."""
    return getattr(t, SHARD_DIM_ATTR)


def replicated(module: nn.Module) -> nn.Module:
    """Tag every tensor of a layer each TP rank holds whole (norms) as REPLICATED."""
    for t in module.state_dict(keep_vars=True).values():
        tag_shard_dim(t, REPLICATED)
    return module


def shard_dims(model: nn.Module) -> dict[str, int | None]:
    """{state_dict key: its tagged split dim or REPLICATED} for every tensor of `model`.
    ValueError naming every untagged tensor: its TP shards could not be merged safely."""
    dims, untagged = {}, []
    for key, t in model.state_dict(keep_vars=True).items():
        if key.endswith("_extra_state"):  # megatron-core's always-None extra state: no tensor
            continue
        if hasattr(t, SHARD_DIM_ATTR):
            dims[key] = shard_dim(t)
        else:
            untagged.append(key)
    if untagged:
        raise ValueError(f"{type(model).__name__} has tensors without a tensor-parallel tag: {untagged[:6]}; "
                         "build the layer through megatron/model/linear.py (column_parallel, row_parallel, "
                         "vocab_parallel_embedding), wrap a layer every rank holds whole in "
                         "megatron.parallel.shard_tags.replicated, or tag it with shard_tags.tag_shard_dim, "
                         "so a tensor-parallel checkpoint merge knows which dim its shards split")
    return dims
