#!/usr/bin/env python
"""Run an experiment matrix (from tools/make_experiments.py) locally, one run after another: `python
tools/run_matrix.py --help`; the tool is study/run_matrix.py."""
from megatron.errors import run_cli
from study.run_matrix import main

if __name__ == "__main__":
    run_cli(main, "run_matrix.py", expected=(ValueError,))  # read_matrix's input errors are ValueErrors
