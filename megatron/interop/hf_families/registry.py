"""The Hugging Face families this stack imports and exports: one file per family in this package,
each a `HFFamily` subclass decorated `@register_family`, and the only place a stock class's name
appears (tests/unit/test_hf_families.py). Every module of the package is imported on first use, so
a new family is one new file plus its test; hf_config.py, hf_stock.py, hf_weights.py and the
adapters read a family only through `families()` / `family()`."""
from __future__ import annotations

import importlib
import pkgutil

from megatron.errors import UserError

from .base import HFFamily

_FAMILIES: dict[str, HFFamily] = {}
_IMPORTED = []  # [True] once every family file of the package was imported


def register_family(cls: type[HFFamily]) -> type[HFFamily]:
    family = cls()
    _FAMILIES[family.arch] = family
    return cls


def _import_all() -> None:
    package = importlib.import_module(__package__)
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        importlib.import_module(f"{__package__}.{info.name}")


def families() -> dict[str, HFFamily]:
    """{stock class name: its family}, in the order of the family files' names."""
    if not _IMPORTED:  # a family module imported on its own registers only itself
        _import_all()
        _IMPORTED.append(True)
    return dict(sorted(_FAMILIES.items(), key=lambda kv: type(kv[1]).__module__))


def family(arch: str) -> HFFamily:
    """The family of stock class `arch` (config.json's architectures[0])."""
    found = families().get(arch)
    if found is None:
        raise UserError(f"architecture {arch!r} is not supported; this stack reads {', '.join(families())}")
    return found


def adapter(arch: str, model_cfg):
    """The state-dict adapter of stock class `arch` for the model `model_cfg` describes."""
    return family(arch).adapter(model_cfg)
