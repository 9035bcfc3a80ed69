"""Merging entries: flat keys from files and overrides -> one value per key, with its origin."""
from __future__ import annotations

import copy

from megatron.config.errors import UNKNOWN, Problem, did_you_mean
from megatron.config.fields import default_of
from megatron.config.foreign import attention_type_names, feature_of, feature_of_attention_type, refusals
from megatron.config.schema import ALIASES, KEYS, canonical, hyphen
from megatron.config.sources import Entry
from megatron.config.validate import unknown_problem, value_problem


def merge_entries(entries: list[Entry]) -> tuple[dict, dict, list[Problem]]:
    """({name: value}, {name: origin}, problems): later entries replace earlier ones wholesale."""
    merged, origins, alias_vals, problems, foreign = {}, {}, {}, [], {}
    for e in entries:
        name = canonical(e.key)
        path = nested_path(e.key)
        if path is not None:  # `optimizer.params.lr`, `zero_optimization.stage`, NeoX's flat `lr`
            problem = set_nested(merged, origins, path, e)
            if problem:
                problems.append(problem)
        elif name in ALIASES:
            alias_vals[ALIASES[name]] = (name, e)
        elif name in KEYS:
            merged[name], origins[name] = copy.deepcopy(e.value), e.origin
        elif feature_of(name) is not None:  # a NeoX feature this stack lacks: named, not "unknown"
            foreign.setdefault(feature_of(name), []).append((name, e.key, e.value, e.origin))
        else:
            problems.append(unknown_problem(e.key, e.origin))
    for feature in dict.fromkeys(map(feature_of_attention_type, attention_type_names(merged.get("attention_config")))):
        if feature is not None:  # on that feature's line (foreign.py), not a second one
            foreign.setdefault(feature, []).append(("attention_config", "attention_config", merged["attention_config"],
                                                    origins["attention_config"]))
    problems += refusals(foreign)
    for target, (alias, e) in alias_vals.items():
        if target not in merged:
            merged[target], origins[target] = copy.deepcopy(e.value), e.origin
        elif merged[target] != e.value:
            problems.append(value_problem(alias, e.value, e.origin, f"alias of {hyphen(target)}, "
                                          f"which is set to {merged[target]!r} in {origins[target]}; "
                                          "they must agree"))
    return merged, origins, problems


def located(issues: list[tuple[str, str]], value_of, origins: dict) -> list[Problem]:
    """Attach the current value and its origin to (key, what is wrong) issues."""
    return [value_problem(name, value_of(name), origins.get(name, "default"), what)
            for name, what in issues]


# NeoX's flat `lr`: NeoX derives it from optimizer.params.lr (arguments.py), which is what it sets here.
FLAT_PATHS = {"lr": ("optimizer", "params", "lr")}


def nested_path(raw_key: str) -> tuple[str, ...] | None:
    """The path a dotted key (or NeoX's flat `lr`) names inside a section's value, else None."""
    if canonical(raw_key) in FLAT_PATHS:
        return FLAT_PATHS[canonical(raw_key)]
    if "." not in raw_key:
        return None
    head, *rest = raw_key.split(".")
    return (canonical(head), *rest)


def set_nested(merged: dict, origins: dict, path: tuple[str, ...], e: Entry) -> Problem | None:
    """Set one value inside a mapping-valued key (later entries still replace the whole key): the
    rest of the section keeps its merged or default value. A path into a key that is not a mapping
    is one problem naming it."""
    head, *inner = path
    sections = [k for k, i in KEYS.items() if "dict" in str(i.type)]  # mapping-valued keys
    base = merged[head] if head in merged else (default_of(KEYS[head].field) if head in KEYS else None)
    if base is None and head in sections:  # a section off by default (fp16: null) set one key at a time
        base = {}
    if head not in sections or not isinstance(base, dict) or not inner:
        near = did_you_mean(head, sections)
        return Problem(UNKNOWN, f"{e.key!r} (in {e.origin}): {head!r} is not a section that takes a dotted path"
                                + (near if near else f" ({', '.join(sections)}); set the whole key instead"))
    value = copy.deepcopy(base)
    node = value
    for part in inner[:-1]:
        if not isinstance(node.get(part, {}), dict):
            return Problem(UNKNOWN, f"{e.key!r} (in {e.origin}): {part!r} inside {head} is not a mapping")
        node = node.setdefault(part, {})
    node[inner[-1]] = copy.deepcopy(e.value)
    merged[head], origins[head] = value, e.origin
    return None
