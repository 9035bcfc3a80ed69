"""Declaring a config key once (default + doc + constraints) and checking a raw YAML value
against it. The loader and the doc generator both read this metadata, so they cannot drift."""
from __future__ import annotations

import copy
import dataclasses
import math
import types
import typing
from collections.abc import Callable
from typing import Any

_NO_DEFAULT = object()


def key(default: Any = _NO_DEFAULT, doc: str = "", *, choices=None, required: bool = False,
        ge=None, gt=None, le=None, lt=None, inert: bool = False, read_by: tuple[str, ...] = (),
        default_from: str | None = None):
    """A dataclass field carrying its documentation and value constraints.

    choices: tuple of allowed strings, or a zero-argument callable returning them (evaluated
    lazily, e.g. the positional-scheme registry). required: the key must be set by some file.
    inert: accepted for NeoX compatibility but changes nothing here (said so in the docs).
    read_by: the positional schemes that read it (a scheme's own option; docs say so).
    default_from: a None value means this other key's value (derived by the section).
    """
    meta = {"doc": doc, "choices": choices, "required": required, "inert": inert,
            "ge": ge, "gt": gt, "le": le, "lt": lt, "read_by": read_by, "default_from": default_from}
    if required:
        default = None
    if default is _NO_DEFAULT:
        raise TypeError("key() needs a default (or required=True)")
    if isinstance(default, (dict, list)):
        frozen = copy.deepcopy(default)
        return dataclasses.field(default_factory=lambda: copy.deepcopy(frozen), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def choices_of(f: dataclasses.Field) -> tuple[str, ...] | None:
    c = f.metadata.get("choices")
    return tuple(c()) if callable(c) else (tuple(c) if c else None)


def default_of(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return f.default


def _split_optional(tp) -> tuple[Any, bool]:
    """`X | None` -> (X, True); `X` -> (X, False)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def type_str(tp) -> str:
    inner, optional = _split_optional(tp)
    if typing.get_origin(inner) is list:
        s = f"list[{typing.get_args(inner)[0].__name__}]"
    else:
        s = inner.__name__
    return s + (" | None" if optional else "")


def _scalar(value, tp) -> tuple[bool, Any]:
    """Type one scalar. bool is never an int/float here: `true` for a layer count is a typo."""
    if tp is bool:
        return isinstance(value, bool), value
    if isinstance(value, bool):
        return False, value
    if tp is int:
        return isinstance(value, int), value
    if tp is float:
        if isinstance(value, (int, float)):
            return True, float(value)
        if isinstance(value, str):  # YAML 1.1 reads `6e-4` (no dot) as a string
            try:
                return True, float(value)
            except ValueError:
                return False, value
        return False, value
    if tp is str:
        return isinstance(value, str), value
    if tp is dict:
        return isinstance(value, dict), value
    if tp is list:  # a nested structure the field's own check() reads (NeoX's attention_config)
        return isinstance(value, (list, tuple)), list(value) if isinstance(value, (list, tuple)) else value
    raise AssertionError(f"unsupported config field type {tp!r}")


def coerce(value, tp) -> tuple[bool, Any]:
    """(ok, typed value) for a raw YAML value against a field annotation."""
    inner, optional = _split_optional(tp)
    if value is None:
        return optional, None
    if typing.get_origin(inner) is list:
        if not isinstance(value, (list, tuple)):
            return False, value
        elem = typing.get_args(inner)[0]
        out = []
        for v in value:
            ok, tv = _scalar(v, elem)
            if not ok:
                return False, value
            out.append(tv)
        return True, out
    return _scalar(value, inner)


def normalise_choice(value: str, choices: tuple[str, ...]) -> str | None:
    """Case-insensitive match onto the canonical spelling, or None."""
    for c in choices:
        if c.lower() == value.lower():
            return c
    return None


def nonfinite_path(value, path: str = "") -> str | None:
    """The first NaN/inf number inside a value: 'params.lr = nan' when nested, 'nan' when it is
    the value itself; None if all numbers are finite. No config setting can work with one (a NaN weight decay trains to
    the end on NaN losses), so they are refused wherever they appear, nested sections included."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{path} = {value}" if path else str(value)
    if isinstance(value, dict):
        children = [(f"{path}.{k}" if path else str(k), v) for k, v in value.items()]
    elif isinstance(value, (list, tuple)):
        children = [(f"{path}[{i}]", v) for i, v in enumerate(value)]
    else:
        return None
    for child_path, v in children:
        found = nonfinite_path(v, child_path)
        if found:
            return found
    return None


def range_problem(value, meta) -> str | None:
    """'must be > 0' style text when a number breaks its declared bounds."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    checks: list[tuple[str, Callable[[Any, Any], bool]]] = [
        ("ge", lambda v, b: v >= b), ("gt", lambda v, b: v > b),
        ("le", lambda v, b: v <= b), ("lt", lambda v, b: v < b)]
    sym = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    bad = [f"{sym[n]} {meta[n]}" for n, ok in checks if meta.get(n) is not None and not ok(value, meta[n])]
    if not bad:
        return None
    bounds = [f"{sym[n]} {meta[n]}" for n, _ in checks if meta.get(n) is not None]
    return "must be " + " and ".join(bounds)
