"""Write docs/config.md from the config key declarations; --check exits 1 if it is stale."""
from __future__ import annotations

import difflib
import os
import sys

from megatron.cli_args import ArgumentParser
from megatron.config.docs import render
from megatron.errors import run_cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DOC_PATH = os.path.join(ROOT, "docs", "config.md")


def stale_lines(current: str, fresh: str, most: int = 20) -> str:
    """The changed lines of a unified diff (committed -> generated), at most `most` of them."""
    changed = [line for line in difflib.unified_diff(current.splitlines(), fresh.splitlines(), "committed",
                                                      "generated", lineterm="", n=0)
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    more = f"\n  ... and {len(changed) - most} more" if len(changed) > most else ""
    return "\n".join(f"  {line}" for line in changed[:most]) + more


def main(argv=None) -> int:
    parser = ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/config.md is out of date")
    parser.add_argument("--output", default=DOC_PATH)
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        try:
            with open(args.output, encoding="utf-8") as f:
                current = f.read()
        except FileNotFoundError:
            current = None
        if current != text:
            print(f"{args.output} is stale: it is generated from the config keys and the positional "
                  "schemes (a new scheme joins pos-emb's choices); regenerate it with `make docs` "
                  "(python tools/gen_config_docs.py) and commit it. What differs:", file=sys.stderr)
            print(stale_lines(current or "", text), file=sys.stderr)
            return 1
        print(f"{args.output} is up to date")
        return 0
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    run_cli(main, "gen_config_docs.py")
