"""Normalisation layers: PyTorch's native LayerNorm / RMSNorm (no apex). Every tensor-parallel
rank holds a norm whole: its tensors are tagged replicated (megatron/parallel/shard_tags.py)."""
from torch import nn

from megatron.parallel.shard_tags import replicated


def build_norm(model_cfg, dim: int) -> nn.Module:
    if model_cfg.norm == "layernorm":
        return replicated(nn.LayerNorm(dim, eps=model_cfg.layernorm_epsilon, bias=model_cfg.use_bias_in_norms))
    if model_cfg.norm == "rmsnorm":
        return replicated(nn.RMSNorm(dim, eps=model_cfg.rms_norm_epsilon))
    raise ValueError(f"norm {model_cfg.norm!r} is not supported; use layernorm or rmsnorm")
