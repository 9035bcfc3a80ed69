"""megatron-core's tensor-parallel layers and operations with the interface of our single-rank ones.

Imported only when tp_size > 1 (megatron/parallel/plan.py): importing megatron.core costs ~6 s on
the CPU box.
megatron-core layers return (output, bias); the subclasses return only the output and drop
megatron-core's always-None `_extra_state` entries, so state_dict keys are `weight` / `bias` as
with nn.Linear. Every call passes our ParallelContext's group explicitly, except
vocab_parallel_cross_entropy, which has no group argument in 0.16.1 and reads parallel_state's
tensor-parallel group (the one init_parallel built, so the same group).
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

# (megatron/parallel/__init__.py, imported first as this module's package, filters the warnings
# megatron-core prints at import)
from megatron.core import tensor_parallel as mtp
from megatron.parallel.layout import scheme_dims
from megatron.positional.registry import build_scheme


class _NoExtraState:
    get_extra_state = nn.Module.get_extra_state
    set_extra_state = nn.Module.set_extra_state

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        # megatron-core's load pre-hook adds a `_extra_state` entry that, without extra state,
        # a strict load (DeepSpeed resuming a TP run) reports as unexpected
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        if prefix + "_extra_state" in unexpected_keys:
            unexpected_keys.remove(prefix + "_extra_state")


class ColumnLinear(_NoExtraState, mtp.ColumnParallelLinear):
    """y[..., out/tp] = x W_r^T + b_r; input replicated, output split over TP ranks."""

    def forward(self, x):
        return super().forward(x)[0]


class RowLinear(_NoExtraState, mtp.RowParallelLinear):
    """y = all_reduce(x_r W_r^T) + b; input split over TP ranks, output replicated."""

    def forward(self, x):
        return super().forward(x)[0]


VocabParallelEmbedding = mtp.VocabParallelEmbedding


def copy_to_tp(x: torch.Tensor, group) -> torch.Tensor:
    """Identity forward; all-reduce of the gradient backward."""
    return mtp.copy_to_tensor_model_parallel_region(x, group=group)


class _GatherLastDim(torch.autograd.Function):
    """All-gather along the last dim; backward keeps this rank's slice of the gradient.
    (megatron-core's gather_from_tensor_model_parallel_region allocates on torch.cuda.)"""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        parts = [torch.empty_like(x) for _ in range(torch.distributed.get_world_size(group))]
        torch.distributed.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        size, rank = torch.distributed.get_world_size(ctx.group), torch.distributed.get_rank(ctx.group)
        return grad.chunk(size, dim=-1)[rank].contiguous(), None


def gather_last_dim(x: torch.Tensor, group) -> torch.Tensor:
    return _GatherLastDim.apply(x, group)


def vocab_parallel_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return mtp.vocab_parallel_cross_entropy(logits, labels)


def _copy_of(full: torch.Tensor):
    """An init_method writing `full` into megatron-core's master weight (which it then splits)."""
    def init(master: torch.Tensor) -> None:
        with torch.no_grad():
            master.copy_(full)
    return init


# Each builder takes the layer exactly as the single-rank model built it and returns the
# megatron-core layer holding this rank's slice of the SAME full weight: every rank builds the full
# model from the same seed (megatron-core's use_cpu_initialization does the same: master weight,
# then split), so a TP=2 model starts equal to the TP=1 model built from that seed.
def column_parallel(full: nn.Linear, parallel, weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Module:
    """Output features split contiguously over TP ranks. `weight`, `bias`: full's, with their rows
    already in the order whose contiguous chunks are the ranks' shards (layout.group_shards)."""
    layer = ColumnLinear(full.in_features, full.out_features, config=parallel.megatron_config(full.weight.dtype),
                         init_method=_copy_of(weight), bias=bias is not None,
                         gather_output=False, tp_group=parallel.tp_group)
    if bias is not None:
        with torch.no_grad():
            layer.bias.copy_(bias.chunk(parallel.tp_size, dim=0)[parallel.tp_rank])
    return layer


def row_parallel(full: nn.Linear, parallel) -> nn.Module:
    """Input features split over TP ranks; the full bias is added once, after the all-reduce."""
    layer = RowLinear(full.in_features, full.out_features, config=parallel.megatron_config(full.weight.dtype),
                      init_method=_copy_of(full.weight), bias=full.bias is not None,
                      input_is_parallel=True, skip_bias_add=False, tp_group=parallel.tp_group)
    if full.bias is not None:
        with torch.no_grad():
            layer.bias.copy_(full.bias)
    return layer


def vocab_parallel_embedding(full: nn.Embedding, parallel) -> nn.Module:
    """Vocabulary rows split contiguously over TP ranks; the lookup is all-reduced."""
    if full.num_embeddings % parallel.tp_size:
        raise ValueError(f"padded vocab size {full.num_embeddings} is not divisible by model-parallel-size "
                         f"{parallel.tp_size}; set padded-vocab-size to a multiple of it")
    return VocabParallelEmbedding(full.num_embeddings, full.embedding_dim, init_method=_copy_of(full.weight),
                                  config=parallel.megatron_config(full.weight.dtype), tp_group=parallel.tp_group)


def mark_tensor_parallel(param: torch.Tensor, dim: int) -> None:
    """Tag a parameter as split over TP ranks: DeepSpeed's grad-norm then sums it over ranks
    instead of counting rank 0's copy only (what it does for replicated parameters)."""
    mtp.set_tensor_model_parallel_attributes(param, is_parallel=True, dim=dim, stride=1)


class TensorParallelOps:
    """The tensor-parallel counterpart of megatron/model/sharding.py's Unsharded (same methods):
    what GPTModel's forward does on a rank holding a vocabulary slice and some of the heads."""

    is_tensor_parallel = True

    def __init__(self, parallel):
        self.parallel = parallel

    def logits(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """x (B, L, h), replicated -> this rank's vocabulary slice of the logits (B, L, V/tp). The
        gradient of x is all-reduced over ranks, as in a column-parallel layer."""
        return F.linear(copy_to_tp(x, self.parallel.tp_group), weight)

    def gather_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """(..., V/tp) on each rank -> (..., V) on every rank."""
        return gather_last_dim(logits, self.parallel.tp_group)

    def token_cross_entropy(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """logits (N, V/tp) float32, labels (N,) -> per-token loss (N,)."""
        return vocab_parallel_cross_entropy(logits, labels)

    def dropout_rng(self, device):
        """Attention-probability dropout acts on this rank's heads: the per-rank stream."""
        return self.parallel.rng.fork(device)

    def checkpoint_kwargs(self) -> dict:
        return {"context_fn": self.parallel.rng.checkpoint_context_fn}  # recomputation replays TP dropout

    def full_scheme(self, scheme: nn.Module) -> nn.Module:
        """A TP=1 copy of this rank's positional scheme holding every head (all-gathered over the TP
        group), e.g. to log KERPLE's per-head statistics over all heads. Collective: call on every rank."""
        with torch.random.fork_rng(devices=[]):  # the copy's own init draws must leave no trace
            full = build_scheme(scheme.name, dataclasses.replace(scheme.spec, tp_rank=0, tp_size=1))
        dims = scheme_dims(scheme)
        state = {}
        for name, t in scheme.state_dict().items():
            if dims[name] is None:
                state[name] = t
                continue
            parts = [torch.empty_like(t) for _ in range(self.parallel.tp_size)]
            torch.distributed.all_gather(parts, t.detach().contiguous(), group=self.parallel.tp_group)
            state[name] = torch.cat(parts, dim=dims[name])
        full.load_state_dict(state)
        return full
