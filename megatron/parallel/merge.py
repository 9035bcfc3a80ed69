"""Merge the per-rank module state dicts of a tensor-parallel checkpoint into one TP=1 state dict.

The inverse of megatron/parallel/plan.py: which dim of each tensor the ranks split is not restated
here by layer name, it is what the plan's style for its layer splits (column-wise rows, row-wise
columns, vocabulary rows, the positional scheme's declared heads, norms whole), read off a
GPTModel built on the meta device (no memory, no weights) from the checkpoint's config. A key the
model does not have, or a tensor the plan does not cover, is an error naming it, never a guess.

Split tensors are concatenated along their dim in rank order; replicated ones must agree on every
rank and rank 0's copy is kept. Unlike NeoX's convert_neox_to_hf.py, row-parallel biases are NOT
summed: ours (megatron-core's RowParallelLinear) hold the full bias on every rank and add it once,
after the all-reduce, so they are identical copies.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

import torch
from torch import nn

from megatron.config.model import ModelConfig
from megatron.model.gpt import GPTModel
from megatron.parallel.layout import REPLICATED, ungroup_shards
from megatron.parallel.plan import shard_dims, shard_groups

_LAYER_INDEX = re.compile(r"^layers\.\d+\.")


@dataclass(frozen=True)
class MergePlan:
    """{state_dict key: split dim or REPLICATED} of one model, and how to look a key up in it."""
    dims: dict
    pos_emb: str | None
    described: str  # the model the dims were read from, for error messages
    any_layer_index: bool = False  # a one-layer reference model stands for every layer index
    groups: dict = field(default_factory=dict)  # key -> row groups split on their own (layout.py)

    def groups_of(self, key: str) -> tuple[int, ...] | None:
        return self.groups.get(_LAYER_INDEX.sub("layers.0.", key) if self.any_layer_index else key)

    def dim_of(self, key: str) -> int | None:
        """The concat dim for `key`, or REPLICATED; ValueError for a key the model does not have."""
        lookup = _LAYER_INDEX.sub("layers.0.", key) if self.any_layer_index else key
        if lookup in self.dims:
            return self.dims[lookup]
        if key.startswith("position."):
            raise ValueError(f"checkpoint key {key!r} is not a tensor of pos-emb {self.pos_emb!r}")
        raise ValueError(f"no tensor-parallel merge rule for checkpoint key {key!r}: {self.described} has no "
                         "tensor of that name, so which dim its shards split is unknown (a checkpoint of a "
                         "different model, or a config that does not describe it?)")


def _meta_gpt(model_cfg) -> nn.Module:
    """GPTModel of `model_cfg` on the meta device, TP=1 (the plan says how TP ranks split it)."""
    with torch.random.fork_rng(devices=[]), torch.device("meta"):  # leave no trace in the RNG
        return GPTModel(model_cfg, vocab_size=8)  # the vocab size changes shapes, not split dims


def _config_plan(model_cfg) -> MergePlan:
    model = _meta_gpt(model_cfg)
    return MergePlan(shard_dims(model), model_cfg.pos_emb, "the GPTModel its config describes",
                     groups=shard_groups(model))


@functools.cache
def _reference_plan(pos_emb: str) -> MergePlan:
    """For a caller that knows only the scheme: one layer of every tensor our GPTModel can have
    with `pos_emb` (untied output layer, every bias, layernorm); it stands for every layer index."""
    cfg = ModelConfig(num_layers=1, hidden_size=32, num_attention_heads=4, seq_length=16, pos_emb=pos_emb,
                      no_weight_tying=True, norm="layernorm", use_bias_in_norms=True,
                      use_bias_in_attn_linear=True, use_bias_in_mlp=True)
    return MergePlan(shard_dims(_meta_gpt(cfg)), pos_emb,
                     f"GPTModel with pos-emb {pos_emb!r} (any depth, untied, every bias)", any_layer_index=True)


def merge_plan(source) -> MergePlan:
    """The split dims to merge with. `source`: a ModelConfig (the checkpoint's: exact keys), a
    built model (whole or sharded), a pos-emb name (see _reference_plan), or a MergePlan."""
    if isinstance(source, MergePlan):
        return source
    if isinstance(source, str):
        return _reference_plan(source)
    if isinstance(source, nn.Module):
        cfg = getattr(source, "model_cfg", None)
        return MergePlan(shard_dims(source), getattr(cfg, "pos_emb", None), f"the {type(source).__name__} given",
                         groups=shard_groups(source))
    return _config_plan(source)


def merge_rule(key: str, source) -> int | None:
    """The concat dim for `key`, or REPLICATED (source: see merge_plan); ValueError for a key
    the model does not have."""
    return merge_plan(source).dim_of(key)


def merge_state_dicts(shards: list[dict], source, rtol: float = 1e-5, atol: float = 1e-6) -> dict:
    """Per-rank state dicts (rank order) -> one TP=1 state dict with the same keys.
    `source`: what describes the model (see merge_plan)."""
    assert shards, "no shards to merge"
    plan = merge_plan(source)
    keys = [k for k in shards[0] if not k.endswith("_extra_state")]
    for r, sd in enumerate(shards[1:], 1):
        other = [k for k in sd if not k.endswith("_extra_state")]
        if set(other) != set(keys):
            raise ValueError(f"tensor-parallel shard {r} has different keys than shard 0: "
                             f"{sorted(set(other) ^ set(keys))[:6]}")
    merged = {}
    for key in keys:
        parts = [sd[key] for sd in shards]
        dim = plan.dim_of(key)
        if dim is REPLICATED:
            for r, p in enumerate(parts[1:], 1):
                if p.shape != parts[0].shape or not torch.allclose(p.float(), parts[0].float(), rtol=rtol, atol=atol):
                    raise ValueError(f"{key} should be identical on every tensor-parallel rank, "
                                     f"but rank {r} differs from rank 0")
            merged[key] = parts[0].clone()
        elif plan.groups_of(key) is not None:
            merged[key] = ungroup_shards(parts, plan.groups_of(key), dim=dim)
        else:
            merged[key] = torch.cat(parts, dim=dim)
    return merged
