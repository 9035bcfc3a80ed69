"""Every key documented in docs/config.md does something: the code outside megatron/config/ reads
it (directly, or through a property/method of its section that the code calls, or through the
DeepSpeed JSON built in megatron/config/ds_json.py), or its documentation says it is accepted for
NeoX compatibility with no effect."""
from __future__ import annotations

import glob
import inspect
import os
import re
import sys

from megatron.config.docs import NO_EFFECT
from megatron.config.schema import SECTIONS, canonical
from tests.conftest import ROOT


def _consumer_sources() -> str:
    """The code that acts on a config: everything but megatron/config/, whose only consumer is
    the DeepSpeed JSON builder (describe.py and docs.py only print keys)."""
    files = [os.path.join(ROOT, p) for p in ("train.py", "evaluate.py", "generate.py", "deepy.py")]
    files += glob.glob(os.path.join(ROOT, "tools", "**", "*.py"), recursive=True)
    files += [p for p in glob.glob(os.path.join(ROOT, "megatron", "**", "*.py"), recursive=True)
              if os.sep + os.path.join("megatron", "config") + os.sep not in p]
    files.append(os.path.join(ROOT, "megatron", "config", "ds_json.py"))
    return "\n".join(open(p, encoding="utf-8").read() for p in files)


def _read(name: str, code: str) -> bool:
    """`.name` attribute access, or "name" as a string (getattr over a list of names)."""
    return re.search(rf"\.{name}\b|[\"']{name}[\"']", code) is not None


def _accessors() -> dict[str, set[str]]:
    """{field: names of the section properties/methods whose code reads self.<field>}."""
    out: dict[str, set[str]] = {}
    for cls in SECTIONS.values():
        for attr, member in vars(cls).items():
            if attr.startswith("_") and attr != "__post_init__" or attr == "check":
                continue
            func = member.fget if isinstance(member, property) else member
            if not callable(func):
                continue
            for field in re.findall(r"self\.(\w+)", inspect.getsource(func)):
                out.setdefault(field, set()).add(attr)
    return out


def _documented() -> dict[str, str]:
    """{key: its docs/config.md row}."""
    with open(os.path.join(ROOT, "docs", "config.md"), encoding="utf-8") as f:
        rows = [line for line in f if line.startswith("| `")]
    return {canonical(re.match(r"\| `([^`]+)`", row).group(1)): row for row in rows}


# Keys whose whole effect is to accept or refuse a config: NeoX's attention_config here only
# allows the types that are this stack's attention (global, flash) and refuses the others by name.
VALIDATION_ONLY = {"attention_config"}


def unread_keys() -> set[str]:
    code, accessors = _consumer_sources(), _accessors()
    out = set()
    for name, row in _documented().items():
        if NO_EFFECT in row or _read(name, code) or name in VALIDATION_ONLY:
            continue
        # __post_init__ runs for every config: a key it folds into another (expansion-factor into
        # intermediate-size, sliding-window-width into attention-window) acts through that key.
        if any(a == "__post_init__" or _read(a, code) for a in accessors.get(name, ())):
            continue
        out.add(name)
    return out


def test_every_documented_key_is_read_or_marked_no_effect():
    unread = unread_keys()
    assert not unread, (
        f"documented but never read: {sorted(unread)}: make them work or declare them "
        f"inert=True (docs: '{NO_EFFECT}'), then run tools/gen_config_docs.py")


def test_the_check_finds_an_unread_key(monkeypatch):
    """The search is not vacuous: a documented key nobody reads is reported."""
    real = _documented()
    monkeypatch.setattr(sys.modules[__name__], "_documented",
                        lambda: {**real, "frobnicate_widgets": "| `frobnicate-widgets` | bool | x |"})
    assert "frobnicate_widgets" in unread_keys()
