#!/usr/bin/env python
"""Pack what a lent GPU machine lacks to run this stack's tests and benchmarks, into `.device/`:
`python tools/device_bundle.py --help`; the tool is benchmarks/device_bundle.py."""
from benchmarks.device_bundle import main

if __name__ == "__main__":
    from megatron.errors import run_cli

    run_cli(main, "device_bundle.py")  # a full disk or a failed download is one message
