#!/usr/bin/env python
"""The instruction mix of the attention kernels' inner loop, per kernel x scheme x bias path,: `python
tools/sass_mix.py --help`; the tool is benchmarks/sass_mix.py."""
from benchmarks.sass_mix import main
from megatron.errors import run_cli

if __name__ == "__main__":
    run_cli(main, "sass_mix.py")
