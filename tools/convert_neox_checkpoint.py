#!/usr/bin/env python
"""Convert a NeoX / KERPLE checkpoint (2022 pipeline layer files or the current sequential: `python
tools/convert_neox_checkpoint.py --help`; the tool is megatron/checkpoint/convert_command.py."""
from megatron.checkpoint.convert_command import main
from megatron.errors import run_cli

if __name__ == "__main__":
    run_cli(main, "convert_neox_checkpoint.py", expected=(ValueError,))
