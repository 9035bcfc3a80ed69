"""Attention backends (one file each) behind one interface, plus the shared causal/window mask.

    from megatron.attention import resolve_backend, allowed_mask
    backend = resolve_backend("auto", scheme, device, dtype, training=True)
    out = backend.forward(q, k, v, scheme, q_pos, k_pos, window=None)
"""
from megatron.attention.base import AttentionBackend
from megatron.attention.mask import allowed_mask
from megatron.attention.resolve import backend_names, resolve_backend

__all__ = ["AttentionBackend", "allowed_mask", "backend_names", "resolve_backend"]
