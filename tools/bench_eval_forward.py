#!/usr/bin/env python
"""Whole-model evaluation forward on CPU: our GPT per positional scheme against Hugging Face's: `python
tools/bench_eval_forward.py --help`; the tool is benchmarks/bench_eval_forward.py."""
import sys

from benchmarks.bench_eval_forward import main

if __name__ == "__main__":
    sys.exit(main())
