"""A benchmark's own clock (--time-budget): work that would start after it runs out is skipped
with a line saying so, instead of the whole tool being killed from outside with nothing written.

A GPU is lent for minutes at a time (tools/gpu_check.sh gives each step a share of one 8-minute
call): a table with its last cells marked "out of time" is worth far more than no table. A cell
already running is never interrupted (a Triton compile cannot be), so the caller keeps a margin."""
from __future__ import annotations

import time


class TimeBudget:
    """`seconds` None: unlimited. `expired()` is checked before each unit of work starts."""

    def __init__(self, seconds: float | None, clock=time.monotonic):
        if seconds is not None and seconds <= 0:
            raise ValueError(f"--time-budget must be > 0 seconds, got {seconds}")
        self.seconds = seconds
        self._clock = clock
        self._start = clock()

    def elapsed(self) -> float:
        return self._clock() - self._start

    def expired(self) -> bool:
        return self.seconds is not None and self.elapsed() >= self.seconds

    def skip_note(self) -> str:
        return f"skipped: out of time (--time-budget {self.seconds:g} s)"
