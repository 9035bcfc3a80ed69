#!/usr/bin/env python
"""Training-step speed per positional scheme on our stack: the KERPLE paper's Table 4: `python
tools/bench_train_step.py --help`; the tool is benchmarks/bench_train_step.py."""
from benchmarks.bench_train_step import main
from megatron.errors import run_cli

if __name__ == "__main__":
    run_cli(main, "bench_train_step.py")
