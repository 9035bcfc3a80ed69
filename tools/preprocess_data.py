#!/usr/bin/env python
"""NeoX's preprocess_data.py: JSONL documents into the indexed .bin/.idx format: `python
tools/preprocess_data.py --help`; the tool is megatron/data/preprocess_command.py."""
from megatron.data.preprocess_command import main
from megatron.errors import run_cli

if __name__ == "__main__":
    run_cli(main, "preprocess_data.py", expected=(ValueError,))
