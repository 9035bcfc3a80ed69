#!/usr/bin/env python
"""The paper's config through deepy.py on a GPU: tokens/s and MFU: `python tools/gpu_throughput.py
--help`; the tool is benchmarks/gpu_throughput.py."""
from benchmarks.gpu_throughput import main
from megatron.errors import run_cli

if __name__ == "__main__":
    run_cli(main, "gpu_throughput.py")
