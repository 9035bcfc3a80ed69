"""Merging entries: flat keys from files and overrides -> one value per key, with its origin."""
from __future__ import annotations

import copy

from megatron.config.errors import Problem
from megatron.config.foreign import attention_type_names, feature_of, feature_of_attention_type, refusals
from megatron.config.schema import ALIASES, KEYS, canonical, hyphen
from megatron.config.sources import Entry
from megatron.config.validate import unknown_problem, value_problem


def merge_entries(entries: list[Entry]) -> tuple[dict, dict, list[Problem]]:
    """({name: value}, {name: origin}, problems): later entries replace earlier ones wholesale."""
    merged, origins, alias_vals, problems, foreign = {}, {}, {}, [], {}
    for e in entries:
        name = canonical(e.key)
        if name in ALIASES:
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
