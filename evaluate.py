#!/usr/bin/env python
"""Perplexity of checkpoints at many lengths (the paper's extrapolation evaluation), or the harness
tasks with --tasks: `python evaluate.py --help`. The sweep is megatron/evaluation/sweep.py."""
from megatron.errors import run_cli
from megatron.evaluation.sweep import main

if __name__ == "__main__":
    run_cli(main, "evaluate.py", expected=(ValueError,))  # data and interop code raise plain ValueErrors
