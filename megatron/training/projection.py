"""pos-clamp: projected: after every optimizer step, clamp the stored positional parameters
(KERPLE's p, a, ...) into their domain, as the paper's code did by clamping `.data` when it
trained in fp32.

"Stored" means every copy the next step starts from: the model's parameter and, under mixed
precision or ZeRO, DeepSpeed's fp32 master copy, which the model's copy is overwritten from after
each step. (Clamping only the model's copy is what the paper's code amounted to under bf16: the
straight-through clamp.) Clamping is elementwise, so under tensor parallelism each rank clamps
its own heads. Every rank must call it (ZeRO-3 gathers)."""
from __future__ import annotations

import torch


@torch.no_grad()
def project_positional(scheme, optimizer=None) -> None:
    """Clamp `scheme`'s stored parameters; `optimizer` is the DeepSpeed engine's (None: a plain
    torch optimizer updates the parameters themselves)."""
    params = scheme.clamped_parameters()
    if not params:
        return
    # lazy: DeepSpeed picks (and logs) its accelerator on import: after init_distributed chose one
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param, safe_set_full_fp32_param

    for p, lo, hi in params:
        master = safe_get_full_fp32_param(p)  # ZeRO 1-3 and DeepSpeed's BF16_Optimizer
        if master is not None:
            safe_set_full_fp32_param(p, master.clamp(min=lo, max=hi))
        else:
            master = _unfused_master(optimizer, p)  # FP16_UnfusedOptimizer (fp16, and bf16 without ZeRO)
            if master is not None:
                master.clamp_(min=lo, max=hi)
            elif p.dtype != torch.float32:
                raise RuntimeError(
                    f"pos-clamp: projected found no fp32 master copy of a {p.dtype} positional parameter in "
                    f"{type(optimizer).__name__}; use zero_optimization stage >= 1 or pos-clamp: straight-through")
        if hasattr(p, "ds_id"):  # ZeRO-3: the model's copy is partitioned; write it through a gather
            with deepspeed.zero.GatheredParameters([p], modifier_rank=0):
                p.data.clamp_(min=lo, max=hi)
        else:
            p.data.clamp_(min=lo, max=hi)


def _unfused_master(optimizer, p: torch.nn.Parameter) -> torch.Tensor | None:
    """The fp32 tensor FP16_UnfusedOptimizer keeps for p (fp32_groups parallels fp16_groups)."""
    groups, masters = getattr(optimizer, "fp16_groups", None), getattr(optimizer, "fp32_groups", None)
    if groups is None or masters is None:
        return None
    for group, master_group in zip(groups, masters):
        for q, master in zip(group, master_group):
            if q is p:
                return master
    return None
