"""The attention backends' names in "auto"'s preference order, read from their files'
`@register_backend("name", priority=N)` lines without importing them: the backends import torch
(and Triton), and a config value refused by the loader is answered before torch loads.
tests/unit/test_scheme_options.py holds the names equal to megatron/attention/registry.py's."""
from __future__ import annotations

import ast
import os

from megatron.config.scheme_options import decorator_calls, parse_file

ATTENTION_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "attention")


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
