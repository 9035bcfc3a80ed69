"""Normalisation layers: PyTorch's native LayerNorm / RMSNorm (no apex)."""
from torch import nn


def build_norm(mcfg, dim: int) -> nn.Module:
    if mcfg.norm == "layernorm":
        return nn.LayerNorm(dim, eps=mcfg.layernorm_epsilon, bias=mcfg.use_bias_in_norms)
    if mcfg.norm == "rmsnorm":
        return nn.RMSNorm(dim, eps=mcfg.rms_norm_epsilon)
    raise ValueError(f"norm {mcfg.norm!r} is not supported; use layernorm or rmsnorm")
