#!/usr/bin/env python
"""Compare a few runs' perplexity against length: one table and one figure (what make quickstart:
`python tools/compare_runs.py --help`; the tool is study/compare_runs.py."""
from megatron.errors import run_cli
from study.compare_runs import main

if __name__ == "__main__":
    run_cli(main, "compare_runs.py")
