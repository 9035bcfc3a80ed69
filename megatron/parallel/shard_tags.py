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


GROUPS_ATTR = "tp_shard_groups"


def tag_shard_groups(t: torch.Tensor, groups: tuple[int, ...]) -> None:
    """Say that `t`'s split dim holds consecutive groups of these (full) sizes, each split over the
    ranks on its own: rank r holds [group 0's r-th chunk | group 1's r-th chunk | ...] (a gated
    MLP's [x | gate] halves, grouped-query attention's [Q | K | V]; NeoX's per-rank layouts)."""
    setattr(t, GROUPS_ATTR, tuple(groups))


def shard_groups(t: torch.Tensor) -> tuple[int, ...] | None:
    return getattr(t, GROUPS_ATTR, None)


def group_shards(full: torch.Tensor, groups: tuple[int, ...], tp_size: int, dim: int = 0) -> torch.Tensor:
    """`full` reordered so that contiguous chunks are the ranks' grouped shards (see tag_shard_groups)."""
    pieces = [g.chunk(tp_size, dim=dim) for g in full.split(list(groups), dim=dim)]
    return torch.cat([pieces[i][r] for r in range(tp_size) for i in range(len(groups))], dim=dim)


def ungroup_shards(parts: list[torch.Tensor], groups: tuple[int, ...], dim: int = 0) -> torch.Tensor:
    """The inverse of group_shards over the ranks' parts (rank order): the full tensor."""
    tp = len(parts)
    split = [p.split([g // tp for g in groups], dim=dim) for p in parts]
    return torch.cat([torch.cat([split[r][i] for r in range(tp)], dim=dim) for i in range(len(groups))], dim=dim)


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
