#!/usr/bin/env python
"""Length extrapolation, scheme against scheme and recipe against recipe, on the retrieval corpus:
`python tools/extrapolation_study.py --help`; the tool is study/extrapolation_study.py."""
from megatron.errors import run_cli
from study.extrapolation_study import main

if __name__ == "__main__":
    run_cli(main, "extrapolation_study.py")
