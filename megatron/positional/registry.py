"""Name -> scheme class. Each scheme file registers itself with @register("name"); every module
of this package is imported on first use, so a new scheme is one new file and nothing else.

Relative imports only: the Hugging Face export ships this package's files next to the weights."""
from __future__ import annotations

import importlib
import pkgutil

from .base import PositionalScheme, PositionalSpec
from .options import Option, declared_options

_REGISTRY: dict[str, type[PositionalScheme]] = {}


def register(*names: str):
    def deco(cls):
        for n in names:
            old = _REGISTRY.get(n)
            # The same class imported again (a reloaded module) replaces itself; two classes
            # claiming one name is a mistake.
            if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
                raise RuntimeError(f"positional scheme {n!r} registered twice "
                                   f"({old.__module__}.{old.__qualname__} and {cls.__module__}.{cls.__qualname__})")
            _REGISTRY[n] = cls
        return cls

    return deco


def _load_all() -> None:
    package = importlib.import_module(__package__)
    for mod in pkgutil.iter_modules(package.__path__):
        if mod.name not in ("base", "registry", "options"):
            importlib.import_module(f"{__package__}.{mod.name}")


def scheme_names() -> list[str]:
    _load_all()
    return sorted(_REGISTRY)


def scheme_class(name: str) -> type[PositionalScheme]:
    _load_all()
    if name not in _REGISTRY:
        raise ValueError(f"unknown pos-emb {name!r}; choose one of: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def scheme_options() -> dict[str, tuple[Option, list[str]]]:
    """{key: (option, the schemes reading it)} for every registered scheme's own options."""
    _load_all()
    return declared_options({name: cls.options for name, cls in _REGISTRY.items()})


def option_problems(values: dict) -> list[tuple[str, str]]:
    """Every scheme class's rules between its options (each class's own rule once, inherited
    ones with the class that wrote them), over every model config key's value."""
    _load_all()
    rules = {}
    for name in sorted(_REGISTRY):
        cls = _REGISTRY[name]
        rules.setdefault(cls.option_problems.__func__, cls)
    return [problem for rule, cls in rules.items() for problem in rule(cls, values)]


def instantiate(cls: type[PositionalScheme], name: str, spec: PositionalSpec) -> PositionalScheme:
    """Build scheme `name` of class `cls` (a class may serve several names, e.g. kerple_power_*)."""
    scheme = cls(spec, name) if getattr(cls, "takes_variant_name", False) else cls(spec)
    scheme.name = name
    return scheme


def build_scheme(name: str, spec: PositionalSpec) -> PositionalScheme:
    return instantiate(scheme_class(name), name, spec)
