"""The one error type a user sees for a bad configuration.

Every problem found while loading (unknown keys, bad values, unreadable files) is collected first
and raised together, so a user fixes a config in one pass instead of one key per run.
"""
from __future__ import annotations

from dataclasses import dataclass

from megatron.errors import UserError

# Problem kinds, so callers (and tests) can tell a fragment missing required keys from a bad file.
FILE, UNKNOWN, MISSING, VALUE = "file", "unknown", "missing", "value"


@dataclass(frozen=True)
class Problem:
    kind: str  # one of FILE, UNKNOWN, MISSING, VALUE
    message: str  # full human sentence, already naming key, value, origin and expectation

    def __str__(self) -> str:
        return self.message


class ConfigError(UserError):
    """A configuration the loader rejects; `problems` lists every issue found."""

    def __init__(self, problems: list[Problem] | str):
        if isinstance(problems, str):
            problems = [Problem(VALUE, problems)]
        self.problems = list(problems)
        n = len(self.problems)
        head = "invalid configuration" if n == 1 else f"invalid configuration ({n} problems)"
        super().__init__(head + ":\n" + "\n".join(f"  - {p}" for p in self.problems))
