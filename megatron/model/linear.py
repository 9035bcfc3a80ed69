"""Layer factories: the single-rank layer, or its tensor-parallel shard.

Every factory takes the layer exactly as the single-rank model builds it (an nn.Linear /
nn.Embedding already initialised by our init functions) and returns it unchanged when tp_size is
1, so single-rank models keep their modules, parameter names and random draws. With tp_size > 1
it returns the megatron-core layer holding this rank's slice of the SAME full weight: every rank
builds the full weight from the same seed (megatron-core's use_cpu_initialization does the same:
master weight, then split), so a TP=2 model starts equal to the TP=1 model built from that seed.

Each factory also tags the parameters it returns with the dim it splits (megatron/parallel/
shard_tags.py), at every tp_size: the checkpoint merge reads these tags, not the layer names.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from megatron.parallel.shard_tags import REPLICATED, group_shards, tag_shard_dim, tag_shard_groups


def _tp(parallel) -> bool:
    return parallel is not None and parallel.is_tensor_parallel


def _tagged(layer: nn.Module, weight_dim: int, bias_dim: int | None) -> nn.Module:
    """`layer` with its weight (and bias, if any) tagged with the dim its TP shards split."""
    tag_shard_dim(layer.weight, weight_dim)
    if getattr(layer, "bias", None) is not None:
        tag_shard_dim(layer.bias, bias_dim)
    return layer


def _copy_of(full: torch.Tensor):
    """An init_method writing `full` into megatron-core's master weight (which it then splits)."""
    def init(master: torch.Tensor) -> None:
        with torch.no_grad():
            master.copy_(full)
    return init


def column_parallel(full: nn.Linear, parallel, groups: tuple[int, ...] | None = None) -> nn.Module:
    """Output features split contiguously over TP ranks (QKV: whole heads, rows are per head).
    `groups`: the rows are consecutive groups of these sizes (a gated MLP's [x | gate], GQA's
    [Q | K | V]), each split over the ranks on its own, so that every rank holds its share of each
    group in the same layout (NeoX's per-rank layout)."""
    if not _tp(parallel):
        return _grouped(_tagged(full, 0, 0), groups)
    from megatron.parallel.layers import ColumnLinear

    weight, bias = full.weight, full.bias
    if groups is not None:
        with torch.no_grad():
            weight = group_shards(weight, groups, parallel.tp_size)
            bias = None if bias is None else group_shards(bias, groups, parallel.tp_size)
    layer = ColumnLinear(full.in_features, full.out_features, config=parallel.megatron_config(full.weight.dtype),
                         init_method=_copy_of(weight), bias=bias is not None,
                         gather_output=False, tp_group=parallel.tp_group)
    if bias is not None:
        with torch.no_grad():
            layer.bias.copy_(bias.chunk(parallel.tp_size, dim=0)[parallel.tp_rank])
    return _grouped(_tagged(layer, 0, 0), groups)


def _grouped(layer: nn.Module, groups: tuple[int, ...] | None) -> nn.Module:
    if groups is not None:
        for t in (layer.weight, getattr(layer, "bias", None)):
            if t is not None:
                tag_shard_groups(t, groups)
    return layer


def row_parallel(full: nn.Linear, parallel) -> nn.Module:
    """Input features split over TP ranks; the full bias is added once, after the all-reduce."""
    if not _tp(parallel):
        return _tagged(full, 1, REPLICATED)
    from megatron.parallel.layers import RowLinear

    layer = RowLinear(full.in_features, full.out_features, config=parallel.megatron_config(full.weight.dtype),
                      init_method=_copy_of(full.weight), bias=full.bias is not None,
                      input_is_parallel=True, skip_bias_add=False, tp_group=parallel.tp_group)
    if full.bias is not None:
        with torch.no_grad():
            layer.bias.copy_(full.bias)
    return _tagged(layer, 1, REPLICATED)


def vocab_parallel_embedding(full: nn.Embedding, parallel) -> nn.Module:
    """Vocabulary rows split contiguously over TP ranks; the lookup is all-reduced."""
    if not _tp(parallel):
        return _tagged(full, 0, REPLICATED)
    if full.num_embeddings % parallel.tp_size:
        raise ValueError(f"padded vocab size {full.num_embeddings} is not divisible by model-parallel-size "
                         f"{parallel.tp_size}; set padded-vocab-size to a multiple of it")
    from megatron.parallel.layers import VocabParallelEmbedding

    layer = VocabParallelEmbedding(full.num_embeddings, full.embedding_dim, init_method=_copy_of(full.weight),
                                   config=parallel.megatron_config(full.weight.dtype), tp_group=parallel.tp_group)
    return _tagged(layer, 0, REPLICATED)


def parallel_logits(x: torch.Tensor, weight: torch.Tensor, parallel) -> torch.Tensor:
    """x (B, L, h), replicated -> this rank's vocabulary slice of the logits (B, L, V/tp).
    Under TP the gradient of x is all-reduced over ranks, as in a column-parallel layer."""
    if _tp(parallel):
        from megatron.parallel.layers import copy_to_tp

        x = copy_to_tp(x, parallel.tp_group)
    return F.linear(x, weight)


def gather_logits(logits: torch.Tensor, parallel) -> torch.Tensor:
    """(..., V/tp) on each rank -> (..., V) on every rank."""
    if not _tp(parallel):
        return logits
    from megatron.parallel.layers import gather_last_dim

    return gather_last_dim(logits, parallel.tp_group)


def token_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, parallel) -> torch.Tensor:
    """logits (N, V or V/tp) float32, labels (N,) -> per-token loss (N,)."""
    if not _tp(parallel):
        return F.cross_entropy(logits, labels, reduction="none")
    from megatron.parallel.layers import vocab_parallel_cross_entropy

    return vocab_parallel_cross_entropy(logits, labels)
