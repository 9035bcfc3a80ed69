"""Name -> scheme class. Each scheme file registers itself with @register("name")."""
from __future__ import annotations

import importlib
import pkgutil

from megatron.positional.base import PositionalScheme, PositionalSpec

_REGISTRY: dict[str, type[PositionalScheme]] = {}


def register(*names: str):
    def deco(cls):
        for n in names:
            if n in _REGISTRY:
                raise RuntimeError(f"positional scheme {n!r} registered twice")
            _REGISTRY[n] = cls
        return cls

    return deco


def _load_all() -> None:
    import megatron.positional as pkg

    for mod in pkgutil.iter_modules(pkg.__path__):
        if mod.name not in ("base", "registry"):
            importlib.import_module(f"megatron.positional.{mod.name}")


def scheme_names() -> list[str]:
    _load_all()
    return sorted(_REGISTRY)


def build_scheme(name: str, spec: PositionalSpec) -> PositionalScheme:
    _load_all()
    if name not in _REGISTRY:
        raise ValueError(f"unknown pos-emb {name!r}; choose one of: {', '.join(sorted(_REGISTRY))}")
    cls = _REGISTRY[name]
    scheme = cls(spec, name) if getattr(cls, "takes_variant_name", False) else cls(spec)
    scheme.name = name
    return scheme
