"""The attention backends' names in "auto"'s preference order, read from their files'
`@register_backend("name", priority=N)` lines without importing them: the backends import torch
(and Triton), and a config value refused by the loader is answered before torch loads.
tests/unit/test_scheme_options.py holds the names equal to megatron/attention/registry.py's.

Why a second reader stays beside the registry: the registry knows the names only once every backend
is imported (torch, Triton: seconds), and `attention-backend`'s check runs on every config load,
including the refusals that must come back at once. The folder is the package's own, found by
import machinery without running it (find_spec imports the parent package `megatron` only)."""
from __future__ import annotations

import ast
import importlib.util
import os

from megatron.config.scheme_options import decorator_calls, parse_file

ATTENTION_DIR = importlib.util.find_spec("megatron.attention").submodule_search_locations[0]


def backend_names(directory: str = ATTENTION_DIR) -> list[str]:
    """Every registered backend's name, sorted as backend_classes() sorts them (priority, name)."""
    found = []
    for file in sorted(os.listdir(directory)):
        if not file.endswith(".py"):
            continue
        for node in parse_file(os.path.join(directory, file)).body:
            if isinstance(node, ast.ClassDef):
                for call in decorator_calls(node, "register_backend"):
                    name = ast.literal_eval(call.args[0])
                    priority = ast.literal_eval(next(k.value for k in call.keywords if k.arg == "priority"))
                    found.append((priority, name))
    return [name for _, name in sorted(found)]
