"""Tensor parallelism applied from outside: the one plan that shards a finished GPTModel.

Shaped like torchtitan's `parallelize_llama(model, parallel_dims)` (torchtitan/models/llama3/
infra/parallelize.py): the model is built whole, for one rank, from the run's seed; `gpt_plan` maps
module paths to a style and `parallelize` replaces each module with this rank's shard of it, then
adjusts what the forward needs (each attention's own head count, `model.sharding`). Every rank builds
the same whole model first, so a TP=2 model starts equal to the TP=1 model of that seed.

The same plan says which dim of every state_dict tensor the ranks split (`shard_dims`), and which
tensors are split group by group (`shard_groups`); megatron/parallel/merge.py inverts it to merge
tensor-parallel checkpoints. A tensor no plan entry covers is an error naming it, never a guess.

Megatron-LM's layout (Shoeybi et al. 2019, sec. 3), weights stored [out, in]: QKV and h->4h are
column-wise (output rows and their biases), the attention's dense and 4h->h row-wise (input columns;
their bias is added once, after the all-reduce, so it is whole), the embedding and output layer
split the vocabulary rows, norms are whole on every rank, the positional scheme splits its heads
(as it declares: PositionalScheme.head_dims).
"""
from __future__ import annotations

import dataclasses
import functools

import torch
from torch import nn

from megatron.parallel.layout import REPLICATED, group_shards, scheme_dims
from megatron.positional.registry import build_scheme


def _dims(module: nn.Module, known: dict[str, int | None], style: str) -> dict[str, int | None]:
    """{tensor name: dim} for every tensor of `module`, from what its style splits."""
    out = {}
    for name in module.state_dict():
        if name.endswith("_extra_state"):  # megatron-core's always-None extra state: no tensor
            continue
        if name not in known:
            raise ValueError(f"{type(module).__name__} has a tensor {name!r} that the {style} style does not split "
                             f"(it splits {sorted(known)}); give the layer a style of its own in "
                             "megatron/parallel/plan.py")
        out[name] = known[name]
    return out


class Replicated:
    """Every rank holds the module whole (norms)."""

    groups = None

    def dims(self, module: nn.Module) -> dict[str, int | None]:
        return {name: REPLICATED for name in module.state_dict()}

    def shard(self, module: nn.Module, parallel) -> nn.Module:
        return module


@dataclasses.dataclass(frozen=True)
class Colwise:
    """An nn.Linear's output features (weight and bias rows) split contiguously over the ranks.
    `groups`: the rows are consecutive groups of these sizes (a gated MLP's [x | gate], GQA's
    [Q | K | V]), each split on its own, so every rank holds its share of each (NeoX's layout)."""

    groups: tuple[int, ...] | None = None

    def dims(self, module: nn.Module) -> dict[str, int | None]:
        return _dims(module, {"weight": 0, "bias": 0}, "column-wise")

    def shard(self, module: nn.Linear, parallel) -> nn.Module:
        from megatron.parallel.layers import column_parallel  # lazy: megatron-core's layers (~2 s to import), only for TP > 1

        weight, bias = module.weight, module.bias
        if self.groups is not None:
            with torch.no_grad():
                weight = group_shards(weight, self.groups, parallel.tp_size)
                bias = None if bias is None else group_shards(bias, self.groups, parallel.tp_size)
        return column_parallel(module, parallel, weight, bias)


class Rowwise:
    """An nn.Linear's input features (weight columns) split over the ranks; the bias is whole."""

    groups = None

    def dims(self, module: nn.Module) -> dict[str, int | None]:
        return _dims(module, {"weight": 1, "bias": REPLICATED}, "row-wise")

    def shard(self, module: nn.Linear, parallel) -> nn.Module:
        from megatron.parallel.layers import row_parallel  # lazy: megatron-core's layers (~2 s to import), only for TP > 1

        return row_parallel(module, parallel)


class VocabRows:
    """An nn.Embedding's vocabulary rows split contiguously over the ranks."""

    groups = None

    def dims(self, module: nn.Module) -> dict[str, int | None]:
        return _dims(module, {"weight": 0}, "vocabulary-row")

    def shard(self, module: nn.Embedding, parallel) -> nn.Module:
        # lazy: megatron-core's layers (~2 s to import), only for TP > 1
        from megatron.parallel.layers import vocab_parallel_embedding

        return vocab_parallel_embedding(module, parallel)


class PerHead:
    """The positional scheme: its per-head tensors split by heads (as it declares), the rest whole."""

    groups = None

    def dims(self, scheme: nn.Module) -> dict[str, int | None]:
        return scheme_dims(scheme)

    def shard(self, scheme: nn.Module, parallel) -> nn.Module:
        # lazy: megatron-core's layers (~2 s to import), only for TP > 1
        from megatron.parallel.layers import copy_to_tp, mark_tensor_parallel

        local = scheme_shard(scheme, parallel.tp_rank, parallel.tp_size)
        dims = scheme_dims(local)
        for name, p in local.named_parameters():
            if dims[name] is not REPLICATED:  # DeepSpeed's grad norm then sums it over the ranks
                mark_tensor_parallel(p, dims[name])
        if "replicated_grad_sync" in local.__dict__:  # whole parameters feeding this rank's heads only
            local.__dict__["replicated_grad_sync"] = functools.partial(copy_to_tp, group=parallel.tp_group)
        return local


def scheme_shard(scheme: nn.Module, tp_rank: int, tp_size: int) -> nn.Module:
    """Rank `tp_rank`'s copy of a whole positional scheme: built for its heads from the scheme's own
    spec (per-head constants, such as sandwich's, come from there) and loaded with the whole
    tensors' slices along the dims the scheme declares. A declaration that does not match what the
    scheme builds for a rank is an error naming the tensor."""
    with torch.random.fork_rng(devices=[]):  # the rank's build draws its own init: leave no trace
        local = build_scheme(scheme.name, dataclasses.replace(scheme.spec, tp_rank=tp_rank, tp_size=tp_size))
    built, dims, state = local.state_dict(), scheme_dims(scheme), {}
    for name, t in scheme.state_dict().items():
        part = t if dims[name] is REPLICATED else t.chunk(tp_size, dim=dims[name])[tp_rank]
        if name not in built or built[name].shape != part.shape:
            found = tuple(built[name].shape) if name in built else "no such tensor"
            raise ValueError(
                f"pos-emb {scheme.name!r} tensor {name!r} is {tuple(t.shape)} for {scheme.spec.num_heads} heads and "
                f"{found} for a rank's {local.spec.local_heads} of them, but its head_dims say "
                f"{'whole on every rank' if dims[name] is REPLICATED else f'heads along dim {dims[name]}'} "
                f"(expected {tuple(part.shape)}): declare the dim of its heads in the scheme's `head_dims` "
                "(megatron/positional/base.py); a tensor-parallel shard holds a slice of at most one dim")
        state[name] = part
    local.load_state_dict(state)
    return local


def gpt_plan(model: nn.Module) -> dict[str, object]:
    """{module path in GPTModel: its style}."""
    plan = {"word_embeddings": VocabRows(), "position": PerHead(), "final_norm": Replicated()}
    if model.output_layer is not None:
        plan["output_layer"] = Colwise()  # vocabulary rows, like the embedding
    for i, layer in enumerate(model.layers):
        plan.update({
            f"layers.{i}.input_layernorm": Replicated(),
            f"layers.{i}.attention.query_key_value": Colwise(layer.attention.qkv_groups),
            f"layers.{i}.attention.dense": Rowwise(),
            f"layers.{i}.post_attention_layernorm": Replicated(),
            f"layers.{i}.mlp.dense_h_to_4h": Colwise(layer.mlp.up_groups),
            f"layers.{i}.mlp.dense_4h_to_h": Rowwise(),
        })
    return plan


def parallelize(model: nn.Module, parallel) -> nn.Module:
    """Shard a whole GPTModel over `parallel`'s tensor-parallel ranks in place, and return it.
    Without tensor parallelism (parallel None or tp_size 1) the model is returned untouched."""
    if parallel is None or not parallel.is_tensor_parallel:
        return model
    from megatron.parallel.layers import TensorParallelOps  # lazy: megatron-core's layers (~2 s to import), only for TP > 1

    for path, style in gpt_plan(model).items():
        owner_path, _, name = path.rpartition(".")
        owner = model.get_submodule(owner_path)
        setattr(owner, name, style.shard(getattr(owner, name), parallel))
    for layer in model.layers:  # each rank computes its own heads
        layer.attention.num_heads //= parallel.tp_size
        layer.attention.num_kv_heads //= parallel.tp_size
    model.sharding = TensorParallelOps(parallel)
    return model


def shard_dims(model: nn.Module) -> dict[str, int | None]:
    """{state_dict key: the dim its tensor-parallel shards split, or REPLICATED} for every tensor of
    `model` (whole or sharded). ValueError naming every tensor the plan does not cover."""
    dims = {}
    for path, style in gpt_plan(model).items():
        dims.update({f"{path}.{name}": d for name, d in style.dims(model.get_submodule(path)).items()})
    missing = [k for k in model.state_dict() if k not in dims and not k.endswith("_extra_state")]
    if missing:
        raise ValueError(f"{type(model).__name__} has tensors without a tensor-parallel rule: {missing[:6]}; give "
                         "their layer a style in megatron/parallel/plan.py (gpt_plan), so a tensor-parallel run "
                         "shards it and a checkpoint merge knows which dim its shards split")
    return dims


def shard_groups(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """{state_dict key: its row groups} for every tensor split group by group (Colwise groups)."""
    out = {}
    for path, style in gpt_plan(model).items():
        if style.groups is not None:
            out.update({f"{path}.{name}": style.groups for name in style.dims(model.get_submodule(path))})
    return out
