"""Optimizer with NeoX parameter groups (megatron/model/utils.py semantics).

NeoX exempts norm parameters and every parameter named `bias` from weight decay; everything
else (KERPLE's bias_p/bias_a included, as in the paper's code) is decayed. With weight_decay 0
there is a single group. NeoX's "Adam" is apex/DeepSpeed FusedAdam in adam_w_mode, i.e. AdamW
(decoupled decay): we use PyTorch's own AdamW.
"""
from __future__ import annotations

import torch
from torch import nn

_NORMS = (nn.LayerNorm, nn.RMSNorm)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay, seen = [], [], set()
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is None or not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            if weight_decay == 0.0 or isinstance(module, _NORMS) or name == "bias":
                no_decay.append(p)
            else:
                decay.append(p)
    groups = [{"params": no_decay, "weight_decay": 0.0}]
    if decay:
        groups.insert(0, {"params": decay, "weight_decay": weight_decay})
    return groups


def build_optimizer(cfg, model: nn.Module) -> torch.optim.Optimizer:
    ocfg = cfg.optimizer
    groups = param_groups(model, ocfg.weight_decay)
    if ocfg.type in ("adam", "adamw"):
        return torch.optim.AdamW(groups, lr=ocfg.lr, betas=tuple(ocfg.betas), eps=ocfg.eps)
    if ocfg.type == "sgd":
        return torch.optim.SGD(groups, lr=ocfg.lr, momentum=ocfg.momentum or 0.0)
    raise ValueError(f"optimizer type {ocfg.type!r} is not supported; use Adam, AdamW or SGD")
