"""argparse types shared by the entry points: an integer flag that must be at least some bound.

`type=int` took `--num-docs -1` (and then islice raised a ValueError naming no flag) or
`--batch-size 0` (range() arg 3 must not be zero). With `type=int_at_least(1)` argparse reports
"argument --num-docs: must be an integer >= 1, got '-1'" and exits 2 before anything loads."""
from __future__ import annotations

import argparse


def int_at_least(minimum: int, meaning: str = ""):
    """An argparse `type` accepting integers >= minimum; `meaning`, e.g. '(0 = all)', ends the message."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}{' ' + meaning if meaning else ''}, "
                                             f"got {text!r}")
        return value

    parse.__name__ = f"integer >= {minimum}"  # argparse names the type in some messages
    return parse
