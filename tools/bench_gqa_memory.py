#!/usr/bin/env python
"""Peak memory of one attention call with grouped-query k/v: repeated to every query head first:
`python tools/bench_gqa_memory.py --help`; the tool is benchmarks/bench_gqa_memory.py."""
from benchmarks.bench_gqa_memory import main
from megatron.errors import run_cli

if __name__ == "__main__":
    run_cli(main, "bench_gqa_memory.py")
