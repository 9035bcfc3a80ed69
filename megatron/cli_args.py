"""argparse pieces shared by the entry points: the parser every CLI uses (a misspelt flag gets a
"did you mean"), and an integer flag that must be at least some bound.

`type=int` took `--num-docs -1` (and then islice raised a ValueError naming no flag) or
`--batch-size 0` (range() arg 3 must not be zero). With `type=int_at_least(1)` argparse reports
"argument --num-docs: must be an integer >= 1, got '-1'" and exits 2 before anything loads."""
from __future__ import annotations

import argparse
import sys

from megatron.config.errors import close_matches


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, whose errors name the flag a misspelt one was meant to be. `--chekpoint X`
    otherwise gets "the following arguments are required: --checkpoint" (the required check comes
    first) or "unrecognized arguments: --chekpoint X", neither pointing at the typo."""

    def parse_known_args(self, args=None, namespace=None):
        self._given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        super().error(message + self._suggestions())

    def _suggestions(self) -> str:
        known = [s for action in self._actions for s in action.option_strings if s.startswith("--")]
        hints = []
        for arg in getattr(self, "_given", []):
            flag = arg.split("=", 1)[0]
            if not flag.startswith("--") or flag in known or any(k.startswith(flag) for k in known):
                continue  # a known flag, or an abbreviation argparse accepts
            close = close_matches(flag, known, n=1)
            if close:
                hints.append(f"{flag}: did you mean {close[0]}?")
        return ("; " + "; ".join(hints)) if hints else ""


def input_output_parser(doc: str, input_help: str, output_help: str) -> ArgumentParser:
    """The parser of a command that reads a checkpoint or model (--input) and writes a whole directory
    (--output, refused when it exists unless --overwrite): the converters, the merge and HF import."""
    p = ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", required=True, help=input_help)
    p.add_argument("--output", required=True, help=output_help)
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --output directory (all of it; without this flag it is refused)")
    return p


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
