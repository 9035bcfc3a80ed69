#!/usr/bin/env python
"""The one command that regenerates every table and plot from result files (+ kernels from
checkpoints): `python tools/make_report.py --help`; the tool is study/make_report.py."""
from megatron.errors import run_cli
from study.make_report import main

if __name__ == "__main__":
    run_cli(main, "make_report.py", expected=(ValueError,))
