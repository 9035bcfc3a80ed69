"""Pick an attention backend for (scheme, device, dtype). No silent fallback: an explicit name
that cannot run raises; only "auto" chooses, and it logs what it chose."""
from __future__ import annotations

import logging

import torch

from megatron.attention.base import AttentionBackend
from megatron.attention.registry import backend_classes

logger = logging.getLogger("megatron.attention")


def backend_names() -> list[str]:
    """Registered backend names in "auto" preference order (reference last)."""
    return list(backend_classes())


def _supporting(scheme, device, dtype, training) -> list[str]:
    return [n for n, cls in backend_classes().items()
            if cls().unsupported_reason(scheme, device, dtype, training) is None]


def resolve_backend(name: str, scheme, device: torch.device | str, dtype: torch.dtype,
                    training: bool) -> AttentionBackend:
    device = torch.device(device)
    classes = backend_classes()
    where = f"pos-emb {scheme.name!r} on {device.type}/{str(dtype).replace('torch.', '')}" + (
        " (training)" if training else " (inference)")
    if name == "auto":
        for candidate, cls in classes.items():
            backend = cls()
            if backend.unsupported_reason(scheme, device, dtype, training) is None:
                logger.info("attention backend auto -> %s for %s", candidate, where)
                return backend
        raise AssertionError(f"no backend supports {where}; the reference backend should")
    if name not in classes:
        raise ValueError(f"unknown attention backend {name!r}; choose 'auto' or one of: "
                         f"{', '.join(classes)}")
    backend = classes[name]()
    reason = backend.unsupported_reason(scheme, device, dtype, training)
    if reason is not None:
        raise ValueError(f"attention backend {name!r} cannot run {where}: {reason}. Backends that "
                         f"support it: {', '.join(_supporting(scheme, device, dtype, training))} "
                         "(or use 'auto')")
    return backend
