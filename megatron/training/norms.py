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


def _sum_squares(tensors) -> torch.Tensor:
    total = torch.zeros((), dtype=torch.float64)
    for t in tensors:
        total += t.detach().float().pow(2).sum().double().cpu()
    return total


def grad_norm(model: torch.nn.Module, mpu=None) -> float:
    """L2 norm of all gradients (p.grad), summed over the tensor-parallel group when there is one."""
    from deepspeed.runtime.utils import is_model_parallel_parameter

    first_tp = mpu is None or mpu.get_model_parallel_rank() == 0
    grads = [p.grad for p in model.parameters()
             if p.grad is not None and (first_tp or is_model_parallel_parameter(p))]
    total = _sum_squares(grads)
    if mpu is not None:
        device = grads[0].device if grads else torch.device("cpu")
        total = total.to(device)
        torch.distributed.all_reduce(total, group=mpu.get_model_parallel_group())
    return math.sqrt(float(total))


def per_parameter_grad_norms(model: torch.nn.Module) -> dict[str, float]:
    """{name: L2 norm of its full gradient}; call after the last backward, before the step."""
    from deepspeed.utils import safe_get_full_grad

    out = {}
    for name, p in model.named_parameters():
        g = safe_get_full_grad(p)
        if g is not None:
            out[name] = float(g.detach().float().norm())
    return out


def per_parameter_norms(model: torch.nn.Module) -> dict[str, float]:
    """{name: L2 norm of the parameter} (ZeRO-3 partitions gathered, in fp32)."""
    from deepspeed.utils import safe_get_full_fp32_param

    out = {}
    for name, p in model.named_parameters():
        full = safe_get_full_fp32_param(p) if hasattr(p, "ds_id") else p
        out[name] = float(full.detach().float().norm())
    return out


def total(norms: dict[str, float]) -> float:
    """The global L2 norm of the tensors whose norms are given."""
    return math.sqrt(sum(v * v for v in norms.values()))
