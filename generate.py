#!/usr/bin/env python
"""Text generation from a checkpoint, kv-cache on: `python generate.py --help`. The command is
megatron/generate_command.py; the decoding loop megatron/generation.py."""
from megatron.errors import run_cli
from megatron.generate_command import main

if __name__ == "__main__":
    run_cli(main, "generate.py", expected=(ValueError,))  # tokenizer and interop input errors are ValueErrors
