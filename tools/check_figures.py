#!/usr/bin/env python
"""Compare a fresh run's perplexities with the figures the docs show (docs/readme_figures.json: the:
`python tools/check_figures.py --help`; the tool is study/check_figures.py."""
from megatron.errors import run_cli
from study.check_figures import main

if __name__ == "__main__":
    run_cli(main, "check_figures.py")
