"""load_config: files + overrides -> one validated NeoXConfig, or one ConfigError with every problem."""
from __future__ import annotations

import copy
import os
from functools import partial

from megatron.config.errors import ConfigError, Problem
from megatron.config.schema import ALIASES, KEYS, SECTIONS, canonical, hyphen
from megatron.config.sources import Entry, read_files
from megatron.config.validate import cross_section_problems, type_section, unknown_problem, value_problem


def load_config(paths=(), overrides: dict | None = None):
    """Merge the YAML files in order (later wins), then `overrides` (same flat keys), validate all.

    Raises ConfigError listing every problem found.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = list(paths)
    entries, texts, problems = read_files(paths)
    entries += [Entry(k, v, "overrides") for k, v in (overrides or {}).items()]
    if problems:  # keys from unreadable files are unknown: report files (and typos) only
        raise ConfigError(problems + _merge(entries)[2])
    run_name = os.path.splitext(os.path.basename(os.fspath(paths[0])))[0] if paths else "default"
    return build(entries, texts, run_name)


def _merge(entries: list[Entry]) -> tuple[dict, dict, list[Problem]]:
    """({name: value}, {name: origin}, problems): later entries replace earlier ones wholesale."""
    merged, origins, alias_vals, problems = {}, {}, {}, []
    for e in entries:
        name = canonical(e.key)
        if name in ALIASES:
            alias_vals[ALIASES[name]] = (name, e)
        elif name in KEYS:
            merged[name], origins[name] = copy.deepcopy(e.value), e.origin
        else:
            problems.append(unknown_problem(e.key, e.origin))
    for target, (alias, e) in alias_vals.items():
        if target not in merged:
            merged[target], origins[target] = copy.deepcopy(e.value), e.origin
        elif merged[target] != e.value:
            problems.append(value_problem(alias, e.value, e.origin, f"alias of {hyphen(target)}, "
                                          f"which is set to {merged[target]!r} in {origins[target]}; "
                                          "they must agree"))
    return merged, origins, problems


def build(entries: list[Entry], texts: dict[str, str], run_name: str):
    """Type, construct and check every section; raise once if anything is wrong."""
    from megatron.config.neox import NeoXConfig

    merged, origins, problems = _merge(entries)
    sections, clean = {}, True
    for sec, cls in SECTIONS.items():
        kwargs, sec_problems = type_section(sec, merged, origins)
        problems += sec_problems
        if sec_problems:
            clean = False
            continue
        sections[sec] = cls(**kwargs)
        problems += _located(sections[sec].check(), partial(getattr, sections[sec]), origins)
    if clean:
        cfg = NeoXConfig(**sections, config_files=dict(texts), _sources=tuple(entries))
        problems += _located(cross_section_problems(cfg), partial(_flat_value, cfg), origins)
    if problems:
        raise ConfigError(problems)
    return _derive(cfg, run_name)


def _flat_value(cfg, name: str):
    return getattr(getattr(cfg, KEYS[name].section), name)


def _located(issues: list[tuple[str, str]], value_of, origins: dict) -> list[Problem]:
    """Attach the current value and its origin to (key, what is wrong) issues."""
    return [value_problem(name, value_of(name), origins.get(name, "default"), what)
            for name, what in issues]


def _derive(cfg, run_name: str):
    """Defaults that depend on other keys, filled in so the saved config states them."""
    from megatron.config.paths import derive_paths

    return derive_paths(cfg, run_name)
