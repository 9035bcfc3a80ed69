#!/usr/bin/env python
"""The reproduction's experiment matrix from a base config: `python tools/make_experiments.py
--help`; the tool is study/make_experiments.py."""
from megatron.errors import run_cli
from study.make_experiments import main

if __name__ == "__main__":
    run_cli(main, "make_experiments.py", expected=(ValueError,))
