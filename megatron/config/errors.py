"""The one error type a user sees for a bad configuration.

Every problem found while loading (unknown keys, bad values, unreadable files) is collected first
and raised together, so a user fixes a config in one pass instead of one key per run.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass

from megatron.errors import EXIT_MISSING_INPUTS, UserError

# Problem kinds, so callers (and tests) can tell a fragment missing required keys from a bad file.
# INPUT: a data/tokenizer/checkpoint file the config names is not on this machine (the config is fine).
FILE, UNKNOWN, MISSING, VALUE, INPUT = "file", "unknown", "missing", "value", "input"


@dataclass(frozen=True)
class Problem:
    kind: str  # one of FILE, UNKNOWN, MISSING, VALUE, INPUT
    message: str  # full human sentence, already naming key, value, origin and expectation

    def __str__(self) -> str:
        return self.message


def close_matches(word: str, candidates, n: int = 3, cutoff: float = 0.6) -> list[str]:
    """The candidates a typo most likely meant, nearest first: the one home of "did you mean" for
    config keys, choice values, config file names and harness task names. Case and -/_ are
    ignored (`kerple-log` means `kerple_log`)."""
    def norm(s: str) -> str:
        return s.lower().replace("-", "_")

    by_norm: dict[str, str] = {}
    for c in candidates:
        by_norm.setdefault(norm(c), c)
    if norm(word) in by_norm:  # only the case or a hyphen differs: that one, not its neighbours too
        return [by_norm[norm(word)]]
    return [by_norm[m] for m in difflib.get_close_matches(norm(word), list(by_norm), n=n, cutoff=cutoff)]


def did_you_mean(word: str, candidates, quote=repr) -> str:
    """'; did you mean X?' (or 'X or Y'), or '' when nothing is close."""
    close = close_matches(word, candidates)
    return f"; did you mean {' or '.join(map(quote, close))}?" if close else ""


class ConfigError(UserError):
    """A configuration the loader rejects; `problems` lists every issue found."""

    head = "invalid configuration"
    counted = "problems"
    traceback_helps = False  # the message lists every problem; a traceback would show only the loader

    def __init__(self, problems: list[Problem] | str):
        if isinstance(problems, str):
            problems = [Problem(VALUE, problems)]
        self.problems = list(problems)
        n = len(self.problems)
        head = self.head if n == 1 else f"{self.head} ({n} {self.counted})"
        super().__init__(head + ":\n" + "\n".join(f"  - {p}" for p in self.problems))


class MissingInputs(ConfigError):
    """The configuration is valid; only files it names (data, tokenizer, checkpoint) are not on this
    machine. Its own exit status, so a script (or a user with `deepy.py --dry-run` on a machine
    without the data) can tell it from a config that is wrong."""

    head = "config OK; missing files only"
    counted = "inputs"
    exit_code = EXIT_MISSING_INPUTS
