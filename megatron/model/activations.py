"""The MLP's activation, as NeoX's get_activation chooses it (megatron/model/activations.py there).

Plain activations act on the whole first projection. Gated ones split it into halves [x, gate]
(NeoX's Gated_Activation: `x, gate = chunk(2)`) and return act(gate) * x; Llama's SwiGLU is
swish(gate) * up in this layout (gate = its gate_proj, x = its up_proj)."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


def tanh_gelu(x: torch.Tensor) -> torch.Tensor:
    """NeoX's bias_gelu (the fused kernel bias-gelu-fusion selects): GELU's tanh approximation with
    NeoX's rounded constant sqrt(2/pi) = 0.79788456."""
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1.0 + 0.044715 * x * x)))


def erf_gelu(x: torch.Tensor) -> torch.Tensor:
    """NeoX's onnx_safe GELU, with its constant 1.41421 for sqrt(2)."""
    return x * 0.5 * (torch.erf(x / 1.41421) + 1.0)


def swish(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


def mish(x: torch.Tensor) -> torch.Tensor:
    return x * torch.tanh(F.softplus(x))


def _gelu(model_cfg) -> Callable:
    if model_cfg.onnx_safe:
        return erf_gelu
    return tanh_gelu if model_cfg.bias_gelu_fusion else F.gelu


# activation name -> the function applied (to the gate, for gated ones)
_FUNCTIONS: dict[str, Callable] = {
    "relu": F.relu, "softsign": F.softsign, "swish": swish, "mish": mish, "silu": F.silu,
    "geglu": F.gelu, "reglu": F.relu, "swiglu": swish, "bilinear": lambda x: x, "glu": torch.sigmoid,
}


class Activation(nn.Module):
    """act(x), or act(gate) * x over the halves of x for a gated activation."""

    def __init__(self, model_cfg):
        super().__init__()
        name = model_cfg.activation
        self.name = name
        self.gated = model_cfg.gated_mlp
        self.fn = _gelu(model_cfg) if name == "gelu" else _FUNCTIONS[name]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., width) -> (..., width or width / 2)
        if not self.gated:
            return self.fn(x)
        x, gate = x.chunk(2, dim=-1)
        return self.fn(gate) * x

    def extra_repr(self) -> str:
        return self.name + (" (gated)" if self.gated else "")
