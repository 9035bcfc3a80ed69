#!/usr/bin/env python
"""Build a ready-to-train corpus offline: (fetch) -> documents -> jsonl.zst -> tokenizer -> .bin/.idx:
`python tools/prepare_data.py --help`; the tool is megatron/data/prepare_command.py."""
from megatron.data.prepare_command import main
from megatron.errors import run_cli

if __name__ == "__main__":
    run_cli(main, "prepare_data.py", expected=(ValueError,))  # the data code's input errors are ValueErrors
