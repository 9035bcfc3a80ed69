"""The one transformer block every NeoX architecture option is an option of: the pre-LN layer,
its MLP with NeoX's activations, and its norms. Every block shape:

    sequential (NeoX, Llama):       x = x + drop(attn(LN1(x)));  x = x + drop(mlp(LN2(x)))
    gpt-j-residual (Pythia, 20B):   x = x + drop(attn(LN1(x))) + drop(mlp(LN2(x)))
    ... with gpt-j-tied:            x = x + drop(attn(LN1(x))) + drop(mlp(LN1(x)))

The norm (layernorm / rmsnorm: PyTorch's own, no apex), the MLP's activation (gated or not) and the
attention's key/value heads are options of the parts, chosen by the config; the attention itself is
megatron/model/attention.py.

The MLP: dense_h_to_4h -> activation -> dense_4h_to_h (NeoX's linear1 / linear2), widths by NeoX's
sizing rule (ModelConfig.mlp_widths). Its activation is chosen as NeoX's get_activation does
(megatron/model/activations.py there): plain activations act on the whole first projection; gated
ones split it into halves [x, gate] (NeoX's Gated_Activation: `x, gate = chunk(2)`) and return
act(gate) * x; Llama's SwiGLU is swish(gate) * up in this layout (gate = its gate_proj, x = its
up_proj)."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from megatron.model.attention import AttentionContext, SelfAttention


# ---- norms ------------------------------------------------------------------------------------
def build_norm(model_cfg, dim: int) -> nn.Module:
    if model_cfg.norm == "layernorm":
        return nn.LayerNorm(dim, eps=model_cfg.layernorm_epsilon, bias=model_cfg.use_bias_in_norms)
    if model_cfg.norm == "rmsnorm":
        return nn.RMSNorm(dim, eps=model_cfg.rms_norm_epsilon)
    raise ValueError(f"norm {model_cfg.norm!r} is not supported; use layernorm or rmsnorm")


# ---- the MLP and its activation ---------------------------------------------------------------
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


class MLP(nn.Module):
    def __init__(self, model_cfg, init_method, output_init_method):
        super().__init__()
        h = model_cfg.hidden_size
        width, inner = model_cfg.mlp_widths
        up = nn.Linear(h, width, bias=model_cfg.use_bias_in_mlp)
        down = nn.Linear(inner, h, bias=model_cfg.use_bias_in_mlp)
        init_method(up.weight)
        output_init_method(down.weight)
        for lin in (up, down):
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
        self.dense_h_to_4h = up
        self.activation = Activation(model_cfg)
        self.dense_4h_to_h = down
        # A gated MLP's first projection holds [x | gate] row groups: a tensor-parallel split keeps
        # each group's share on every rank, so the activation runs on a rank's slice with no comms.
        self.up_groups = (inner, inner) if model_cfg.gated_mlp else None

    def forward(self, x):  # (B, L, h)
        return self.dense_4h_to_h(self.activation(self.dense_h_to_4h(x)))


# ---- the layer -------------------------------------------------------------------------------
class TransformerLayer(nn.Module):
    def __init__(self, model_cfg, init_method, output_init_method):
        super().__init__()
        self.input_layernorm = build_norm(model_cfg, model_cfg.hidden_size)
        self.attention = SelfAttention(model_cfg, init_method, output_init_method)
        # Kept with gpt-j-tied too (unused there): NeoX builds it, and its checkpoints carry it.
        self.post_attention_layernorm = build_norm(model_cfg, model_cfg.hidden_size)
        self.mlp = MLP(model_cfg, init_method, output_init_method)
        self.dropout = nn.Dropout(model_cfg.hidden_dropout)
        self.parallel_residual = model_cfg.gpt_j_residual
        self.tied_norms = model_cfg.gpt_j_tied

    def forward(self, x, ctx: AttentionContext):  # (B, L, h)
        if self.parallel_residual:
            x1 = self.input_layernorm(x)
            x2 = x1 if self.tied_norms else self.post_attention_layernorm(x)
            attn = self.dropout(self.attention(x1, ctx))
            return x + (self.dropout(self.mlp(x2)) + attn)  # NeoX's order: residual + (mlp + attn)
        x = x + self.dropout(self.attention(self.input_layernorm(x), ctx))
        return x + self.dropout(self.mlp(self.post_attention_layernorm(x)))
