#!/usr/bin/env python
"""What retrieval's shared forward saves over K forwards per prompt: `python tools/bench_retrieval.py
--help`; the tool is benchmarks/bench_retrieval.py."""
from benchmarks.bench_retrieval import main
from megatron.errors import run_cli

if __name__ == "__main__":
    run_cli(main, "bench_retrieval.py")
