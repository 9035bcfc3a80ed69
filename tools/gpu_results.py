#!/usr/bin/env python
"""Fold a GPU check's results (tools/gpu_check.sh OUT_DIR) into docs/benchmarks.md and docs/status.md:
`python tools/gpu_results.py --help`; the tool is benchmarks/gpu_results.py."""
from benchmarks.gpu_results import main

if __name__ == "__main__":
    from megatron.errors import run_cli

    run_cli(main, "gpu_results.py")
