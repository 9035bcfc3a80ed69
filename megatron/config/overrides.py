"""`-o KEY=VALUE` on a command line (deepy.py, evaluate.py, generate.py, tools): the one parser, so
every entry point reads an override the same way and refuses a key given twice."""
from __future__ import annotations

import yaml

from megatron.config.errors import ConfigError
from megatron.config.schema import canonical
from megatron.config.untrusted_yaml import safe_load


def parse_overrides(items: list[str]) -> dict:
    """{key: value} of -o/--override KEY=VALUE items, each value read as YAML (untrusted: bounded)."""
    out = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--override {item!r} must look like KEY=VALUE (e.g. pos-emb=rotary)")
        k, v = item.split("=", 1)
        if any(canonical(k.strip()) == canonical(seen) for seen in out):
            raise ConfigError(f"--override {k.strip()!r} is given twice; the last would silently win: keep one")
        try:
            out[k.strip()] = safe_load(v, f"--override {k.strip()}")
        except yaml.YAMLError as e:
            raise ConfigError(f"--override {item!r}: the value is not valid YAML "
                             f"({getattr(e, 'problem', None) or e}); quote it, e.g. -o 'key=\"text\"'") from None
    return out
