"""Normalisation layers: PyTorch's native LayerNorm / RMSNorm (no apex)."""
from torch import nn


def build_norm(model_cfg, dim: int) -> nn.Module:
    if model_cfg.norm == "layernorm":
        return nn.LayerNorm(dim, eps=model_cfg.layernorm_epsilon, bias=model_cfg.use_bias_in_norms)
    if model_cfg.norm == "rmsnorm":
        return nn.RMSNorm(dim, eps=model_cfg.rms_norm_epsilon)
    raise ValueError(f"norm {model_cfg.norm!r} is not supported; use layernorm or rmsnorm")
