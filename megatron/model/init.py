"""NeoX weight-initialisation methods (megatron/model/init_functions.py semantics).

`init_method` initialises input projections (embedding, QKV, h->4h, output layer);
`output_layer_init_method` initialises the projections that write into the residual stream
(attention.dense, 4h->h), which NeoX scales down with depth so the residual variance stays flat.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

InitFn = Callable[[torch.Tensor], None]


def _normal(std: float) -> InitFn:
    return lambda w: nn.init.normal_(w, mean=0.0, std=std)


def build_init(name: str, std: float, num_layers: int, hidden_size: int) -> InitFn:
    """Return an in-place initialiser for a weight tensor."""
    if name == "normal":
        return _normal(std)
    if name == "scaled_normal":  # sigma / sqrt(2 L): two residual writes per layer
        return _normal(std / math.sqrt(2.0 * num_layers))
    if name == "single_residual_scaled_normal":  # NeoX's Mamba init: sigma / sqrt(L), one residual write a layer
        return _normal(std / math.sqrt(num_layers))
    if name == "orthogonal":  # Saxe et al. 2013; NeoX's gain sqrt(2 / n_layers) with n_layers 1
        return lambda w: nn.init.orthogonal_(w, gain=math.sqrt(2.0))
    if name == "scaled_orthogonal":  # the same, gain sqrt(2 / L)
        return lambda w: nn.init.orthogonal_(w, gain=math.sqrt(2.0 / num_layers))
    if name == "small_init":  # Nguyen & Salazar 2019: sqrt(2 / (5 h))
        return _normal(math.sqrt(2.0 / (5.0 * hidden_size)))
    if name == "wang_init":  # GPT-J: 2 / (L sqrt(h))
        return _normal(2.0 / (num_layers * math.sqrt(hidden_size)))
    if name == "xavier_normal":
        return nn.init.xavier_normal_
    if name == "xavier_uniform":
        return nn.init.xavier_uniform_
    raise ValueError(f"unknown init method {name!r}")
