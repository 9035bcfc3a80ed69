"""Gradient and parameter norms for the logs.

The global gradient norm is DeepSpeed's (engine.get_global_grad_norm(), which its bf16 and ZeRO
optimizers compute anyway); with a plain optimizer DeepSpeed computes none, so we take it from the
gradients between the last backward and the optimizer step (already averaged over data-parallel
ranks), counting a tensor-parallel replicated parameter once. Per-parameter norms (log-grad-norm,
log-param-norm) gather ZeRO partitions through DeepSpeed's safe_get_* helpers, which every rank
must call; with tensor parallelism they are rank 0's shards.
"""
from __future__ import annotations

import math

import torch


def grad_square_sums(model: torch.nn.Module, mpu=None) -> list[torch.Tensor]:
    """Each gradient's float32 sum of squares, unread (0-d tensors on the gradients' device: the
    trainer reads them with the step's other logged values, megatron/host_reads.py; one read per
    parameter was a host sync per parameter between the backward and the optimizer step). Under
    tensor parallelism a replicated parameter counts on the first rank only."""
    # lazy: DeepSpeed picks (and logs) its accelerator on import: after init_distributed chose one
    from deepspeed.runtime.utils import is_model_parallel_parameter

    first_tp = mpu is None or mpu.get_model_parallel_rank() == 0
    return [p.grad.detach().float().pow(2).sum() for p in model.parameters()
            if p.grad is not None and (first_tp or is_model_parallel_parameter(p))]


def norm_of_squares(squares: list[float], mpu=None, device: torch.device | None = None) -> float:
    """The L2 norm from grad_square_sums' values: their float64 sum in order (as the host adds),
    summed over the tensor-parallel group on `device` when there is one."""
    total = 0.0
    for value in squares:
        total += value
    if mpu is not None:
        reduced = torch.tensor(total, dtype=torch.float64, device=device or torch.device("cpu"))
        torch.distributed.all_reduce(reduced, group=mpu.get_model_parallel_group())
        total = float(reduced)
    return math.sqrt(total)


def per_parameter_grad_norms(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """{name: L2 norm of its full gradient}, unread (0-d float32 tensors); call after the last
    backward, before the step."""
    from deepspeed.utils import safe_get_full_grad  # lazy: DeepSpeed, as in grad_square_sums

    out = {}
    for name, p in model.named_parameters():
        g = safe_get_full_grad(p)
        if g is not None:
            out[name] = g.detach().float().norm()
    return out


def per_parameter_norms(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """{name: L2 norm of the parameter} (ZeRO-3 partitions gathered, in fp32), unread (0-d
    float32 tensors)."""
    from deepspeed.utils import safe_get_full_fp32_param  # lazy: DeepSpeed, as in grad_square_sums

    out = {}
    for name, p in model.named_parameters():
        full = safe_get_full_fp32_param(p) if hasattr(p, "ds_id") else p
        out[name] = full.detach().float().norm()
    return out


def total(norms: dict[str, float]) -> float:
    """The global L2 norm of the tensors whose norms are given."""
    return math.sqrt(sum(v * v for v in norms.values()))
