"""The launchers a config may name: one file per launcher in this package, each a `Launcher`
subclass decorated `@register_launcher`. Every module of the package is imported on first use, so a
new launcher is one new file plus its test; the config's choices (megatron/config/parallel.py),
the ranks (megatron/process/ranks.py) and deepy.py (megatron/launch/launcher.py) read launchers
only through `launchers()` / `launcher()`."""
from __future__ import annotations

import importlib
import pkgutil

from .base import Launcher

_LAUNCHERS: dict[str, Launcher] = {}
_IMPORTED = []  # [True] once every launcher file of the package was imported


def register_launcher(cls: type[Launcher]) -> type[Launcher]:
    _LAUNCHERS[cls.name] = cls()
    return cls


def launchers() -> dict[str, Launcher]:
    """{name: launcher}, pdsh first (NeoX's default), then by name."""
    if not _IMPORTED:  # a launcher module imported on its own registers only itself
        package = importlib.import_module(__package__)
        for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
            importlib.import_module(f"{__package__}.{info.name}")
        _IMPORTED.append(True)
    return dict(sorted(_LAUNCHERS.items(), key=lambda kv: (kv[0] != "pdsh", kv[0])))


def launcher_names() -> tuple[str, ...]:
    return tuple(launchers())


def launcher(name: str) -> Launcher:
    """The launcher the config names (the config's choices have checked the name)."""
    return launchers()[name]
