"""Name -> attention backend class. Each backend file registers itself with @register_backend."""
from __future__ import annotations

import importlib
import os
import pkgutil

from megatron.attention.base import AttentionBackend

_REGISTRY: dict[str, type[AttentionBackend]] = {}
_PRIORITY: dict[str, int] = {}
_NOT_BACKENDS = ("base", "registry", "resolve", "mask")


def register_backend(name: str, priority: int):
    """priority orders the "auto" choice: lower is preferred (fast kernels low, reference last)."""
    def deco(cls):
        if name in _REGISTRY:
            raise RuntimeError(f"attention backend {name!r} registered twice")
        cls.name = name
        cls.priority = priority
        _REGISTRY[name] = cls
        _PRIORITY[name] = priority
        return cls

    return deco


def _load_all() -> None:
    # A backend with optional dependencies (triton, flash-attn) must import without them and say
    # so in unsupported_reason; an ImportError here is a bug, not a reason to skip the backend.
    for mod in pkgutil.iter_modules([os.path.dirname(__file__)]):  # this package's modules
        if mod.name not in _NOT_BACKENDS:
            importlib.import_module(f"megatron.attention.{mod.name}")


def backend_classes() -> dict[str, type[AttentionBackend]]:
    """All registered backends, in "auto" preference order."""
    _load_all()
    return {n: _REGISTRY[n] for n in sorted(_REGISTRY, key=lambda n: (_PRIORITY[n], n))}
