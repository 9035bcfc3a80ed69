#!/usr/bin/env python
"""The whole GPU check in one command, sized for one lent-GPU call (issue 32): `python
tools/gpu_check.py --help`; the tool is benchmarks/gpu_check.py."""
from benchmarks.gpu_check import main

if __name__ == "__main__":
    from megatron.errors import run_cli

    run_cli(main, "gpu_check.py")
