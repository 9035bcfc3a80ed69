#!/usr/bin/env python
"""Attention-only benchmark: every registered backend on the positional schemes asked for, plus:
`python tools/bench_attention.py --help`; the tool is benchmarks/bench_attention.py."""
from benchmarks.bench_attention import main
from megatron.errors import run_cli

if __name__ == "__main__":
    run_cli(main, "bench_attention.py")
