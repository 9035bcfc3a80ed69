"""megatron-core's tensor-parallel layers with the interface of our single-rank layers.

Imported only when tp_size > 1: importing megatron.core costs ~6 s on the CPU box.
megatron-core layers return (output, bias); the subclasses return only the output and drop
megatron-core's always-None `_extra_state` entries, so state_dict keys are `weight` / `bias` as
with nn.Linear. Every call passes our ParallelContext's group explicitly, except
vocab_parallel_cross_entropy, which has no group argument in 0.16.1 and reads parallel_state's
tensor-parallel group (the one init_parallel built, so the same group).
"""
from __future__ import annotations

import torch
from torch import nn

# (megatron/parallel/__init__.py, imported first as this module's package, filters the warnings
# megatron-core prints at import)
from megatron.core import tensor_parallel as mtp


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


def mark_tensor_parallel(param: torch.Tensor, dim: int) -> None:
    """Tag a parameter as split over TP ranks: DeepSpeed's grad-norm then sums it over ranks
    instead of counting rank 0's copy only (what it does for replicated parameters)."""
    mtp.set_tensor_model_parallel_attributes(param, is_parallel=True, dim=dim, stride=1)
