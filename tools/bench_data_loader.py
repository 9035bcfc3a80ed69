#!/usr/bin/env python
"""The training data path alone, timed: how many tokens per second the loader hands the trainer:
`python tools/bench_data_loader.py --help`; the tool is benchmarks/bench_data_loader.py."""
from benchmarks.bench_data_loader import main
from megatron.errors import run_cli

if __name__ == "__main__":
    run_cli(main, "bench_data_loader.py")
