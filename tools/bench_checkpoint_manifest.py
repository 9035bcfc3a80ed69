#!/usr/bin/env python
"""What the checkpoint manifest (megatron/checkpoint/manifest.py) costs a save, on the 162M model:
`python tools/bench_checkpoint_manifest.py --help`; the tool is
benchmarks/bench_checkpoint_manifest.py."""
from benchmarks.bench_checkpoint_manifest import main
from megatron.errors import run_cli

if __name__ == "__main__":
    run_cli(main, "bench_checkpoint_manifest.py")
