"""Typing raw values against the schema, and the rules that span sections.

Field-level problems (type, choices, bounds, missing) come first; a section's own cross-field
rules run only when all its fields typed cleanly, so one typo never cascades into noise (the
rules across sections do the same per section: megatron/config/cross.py).
"""
from __future__ import annotations

from megatron.config.errors import MISSING, UNKNOWN, VALUE, Problem, close_matches, did_you_mean
from megatron.config.fields import (
    choices_of,
    coerce,
    default_of,
    nonfinite_path,
    normalise_choice,
    range_problem,
    type_str,
)
from megatron.config.schema import ALIASES, KEYS, KeyInfo, hyphen


def value_problem(name: str, value, origin: str, what: str) -> Problem:
    return Problem(VALUE, f"{hyphen(name)} = {value!r} (from {origin}): {what}")


def unknown_problem(raw_key: str, origin: str) -> Problem:
    spellings = {}
    for name in list(KEYS) + list(ALIASES):
        spellings[name] = name
        spellings[hyphen(name)] = name
    close = close_matches(raw_key, list(spellings), n=6)
    style = hyphen if "-" in raw_key else (lambda s: s)
    seen = []
    for c in close:  # one suggestion per key, in the user's spelling style
        s = style(spellings[c])
        if s not in seen:
            seen.append(s)
    hint = f"; did you mean {' or '.join(repr(s) for s in seen[:3])}?" if seen else "; no close match"
    return Problem(UNKNOWN, f"unknown key {raw_key!r} (in {origin}){hint}")


def type_value(info: KeyInfo, raw, origin: str) -> tuple[object, Problem | None]:
    """(typed value, problem or None) for one key's raw value."""
    ok, value = coerce(raw, info.type)
    if not ok:
        return None, value_problem(info.name, raw, origin, f"expected {type_str(info.type)}")
    bad = nonfinite_path(value)
    if bad is not None:
        inside = f" ({bad})" if " = " in bad else ""
        return None, value_problem(info.name, raw, origin, f"not a finite number{inside}; NaN and "
                                   "infinity cannot train: give a finite value")
    choices = choices_of(info.field)
    if choices and isinstance(value, str):
        norm = normalise_choice(value, choices)
        if norm is None:
            return None, value_problem(info.name, raw, origin,
                                       f"expected one of {', '.join(choices)}{did_you_mean(value, choices)}")
        value = norm
    bound = range_problem(value, info.field.metadata)
    if bound:
        return None, value_problem(info.name, raw, origin, bound)
    return value, None


def type_section(section: str, merged: dict, origins: dict) -> tuple[dict, list[Problem]]:
    """Typed constructor kwargs for one section from merged {name: raw value}."""
    kwargs, problems = {}, []
    for info in KEYS.values():
        if info.section != section:
            continue
        if info.name not in merged:
            if info.field.metadata.get("required"):
                problems.append(Problem(MISSING, f"{hyphen(info.name)} is required "
                                        f"({type_str(info.type)}) but no config file sets it"))
            kwargs[info.name] = default_of(info.field)
            continue
        value, problem = type_value(info, merged[info.name], origins[info.name])
        if problem:
            problems.append(problem)
        else:
            kwargs[info.name] = value
    return kwargs, problems
