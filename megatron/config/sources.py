"""Reading a configuration: YAML files + overrides -> (key, value, origin) entries, later wins.
It knows nothing of sections or NeoXConfig (megatron/config/neox.py builds itself from these
entries), so the two do not import each other.

NeoX's effective rule (its duplicate check compares raw hyphenated keys against converted ones,
so it never fires) is that a later file replaces a key wholesale, nested dicts included. The
paper's length sweep depends on it: `lengths/length_L.yml` overrides ex_eval.yml's seq-length-val.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import yaml

from megatron.config.errors import FILE, Problem, did_you_mean
from megatron.config.untrusted_yaml import LimitedSafeLoader, YamlLimitError, read_bounded


@dataclass(frozen=True)
class Entry:
    key: str  # as the user spelled it
    value: object
    origin: str  # file path, or loader.OVERRIDE_ORIGIN for -o and replace()


class _StrictLoader(LimitedSafeLoader):
    """SafeLoader (within the untrusted-YAML limits) that records keys set twice in one mapping
    (PyYAML silently keeps the last)."""

    def __init__(self, stream, source: str):
        super().__init__(stream, source)
        self.duplicates: list[tuple[object, int, int]] = []  # (key, first line, second line)

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` merges are allowed
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    if key in first:
                        self.duplicates.append((key, first[key], line))
                    else:
                        first[key] = line
                except TypeError:  # an unhashable key: the base constructor reports it
                    pass
        return super().construct_mapping(node, deep)


def _strict_load(text: str, source: str):
    """(data, duplicates) of one YAML document."""
    loader = _StrictLoader(text, source)
    try:
        return loader.get_single_data(), loader.duplicates
    finally:
        loader.dispose()


def _decode(path: str, raw: bytes) -> tuple[str | None, Problem | None]:
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        return None, Problem(FILE, f"config file {path} is not UTF-8 text: byte {e.start} (line {line}) is "
                             f"0x{raw[e.start]:02x}; save the file as UTF-8")


def did_you_mean_file(path: str, suffixes: tuple[str, ...] = (".yml", ".yaml")) -> str:
    """'; did you mean DIR/quickstart.yml?' for `quickstart.yaml` or `quikstart.yml`: the files with
    these suffixes beside the missing one with a close name (the extension left out of the comparison);
    failing that, files of the same name elsewhere in the current directory or this checkout
    (`20B.yml` from the repository root: tests/fixtures/neox_configs/20B.yml)."""
    folder = os.path.dirname(path)
    try:
        names = [n for n in os.listdir(folder or ".") if n.endswith(suffixes)]
    except OSError:
        names = []
    stems = {os.path.splitext(n)[0]: n for n in sorted(names)}
    stem = os.path.splitext(os.path.basename(path))[0]
    beside = did_you_mean(stem, stems, quote=lambda c: os.path.join(folder, stems[c]))
    if beside:
        return beside
    elsewhere = same_name_elsewhere(os.path.basename(path))
    return f"; did you mean {' or '.join(elsewhere)}?" if elsewhere else ""


# Where a same-named file is looked for: the current directory and this checkout, without the
# folders that hold no configs but many files (a venv, runs, data, git's objects).
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_NOT_SEARCHED = {".git", ".venv", "venv", "node_modules", "__pycache__", "runs", "data", ".pytest_cache"}
_MOST_FILES_SEEN = 20_000  # a bound on the walk: a missing file is answered in well under a second


def same_name_elsewhere(name: str, most: int = 3) -> list[str]:
    """Up to `most` paths (relative to the current directory where they are under it) of files named
    `name` under the current directory or this checkout, the shallowest first."""
    found, seen = set(), 0
    for root in dict.fromkeys((os.getcwd(), _CHECKOUT)):
        for folder, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d not in _NOT_SEARCHED and not d.startswith("."))
            seen += len(files)
            if name in files:
                found.add(os.path.abspath(os.path.join(folder, name)))
            if seen > _MOST_FILES_SEEN:
                break
    shown = [os.path.relpath(p) if not os.path.relpath(p).startswith("..") else p for p in found]
    return sorted(shown, key=lambda p: (p.count(os.sep), p))[:most]


def read_file(path) -> tuple[str | None, dict | None, Problem | None]:
    """(raw text, top-level mapping, problem)."""
    path = os.fspath(path)
    try:
        raw = read_bounded(path, f"config file {path}")
    except YamlLimitError as e:
        return None, None, Problem(FILE, str(e))
    except FileNotFoundError:
        return None, None, Problem(FILE, f"config file not found: {path} (current directory: {os.getcwd()})"
                                   + did_you_mean_file(path))
    except OSError as e:
        return None, None, Problem(FILE, f"cannot read config file {path}: {e.strerror}")
    text, problem = _decode(path, raw)
    if problem:
        return None, None, problem
    try:
        data, duplicates = _strict_load(text, f"config file {path}")
    except YamlLimitError as e:
        return text, None, Problem(FILE, str(e))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else path
        what = getattr(e, "problem", None) or str(e)
        return text, None, Problem(FILE, f"YAML syntax error in {where}: {what}")
    if duplicates:  # the later value would silently win: ask which one the user means
        what = "; ".join(f"{k!r} (lines {a} and {b})" for k, a, b in duplicates)
        return text, None, Problem(FILE, f"config file {path} sets the same key twice in one mapping: {what}; "
                                   "keep one")
    if data is None:  # an empty file (or only comments) sets nothing
        data = {}
    if not isinstance(data, dict):
        return text, None, Problem(FILE, f"config file {path} must contain a mapping of keys to values "
                                   f"at the top level, got {type(data).__name__}")
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        return text, None, Problem(FILE, f"config file {path}: keys must be strings, got {bad!r}")
    spellings: dict[str, list[str]] = {}
    for k in data:
        spellings.setdefault(k.replace("-", "_"), []).append(k)
    twice = [" and ".join(v) for v in spellings.values() if len(v) > 1]
    if twice:  # within one file neither spelling can "win": ask the user to keep one
        return text, None, Problem(FILE, f"config file {path} sets the same key twice with different spellings: "
                                   f"{'; '.join(twice)}; keep one of each")
    return text, data, None


def read_files(paths) -> tuple[list[Entry], dict[str, str], list[Problem]]:
    """Entries in file order, {basename: raw text}, and file-level problems."""
    entries, texts, problems = [], {}, []
    for path in paths:
        text, data, problem = read_file(path)
        if problem:
            problems.append(problem)
            continue
        base = os.path.basename(os.fspath(path))
        if base in texts:  # NeoX keys the checkpoint's copy of each file by basename
            problems.append(Problem(FILE, f"two config files are named {base!r}; basenames must be "
                                    "unique (they key the copies stored in checkpoints)"))
            continue
        texts[base] = text
        entries.extend(Entry(k, v, os.fspath(path)) for k, v in data.items())
    return entries, texts, problems


OVERRIDE_ORIGIN = "-o on the command line"  # where an override's problem is said to come from


def read_entries(paths=(), overrides: dict | None = None) -> tuple[list[Entry], dict[str, str], str, list[Problem]]:
    """(entries, {basename: text}, run name, problems reading the files).

    Entries keep file order, then `overrides` (same flat keys); later ones win when merged.
    The run name is the first file's name without extension ("default" with no file).
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = list(paths)
    entries, texts, problems = read_files(paths)
    entries += [Entry(k, v, OVERRIDE_ORIGIN) for k, v in (overrides or {}).items()]
    run_name = os.path.splitext(os.path.basename(os.fspath(paths[0])))[0] if paths else "default"
    return entries, texts, run_name, problems
