#!/usr/bin/env python
"""Build (or find cached) the DeepSpeed op that every process-group start loads.

On CPU, DeepSpeed's TorchBackend JIT-compiles its shared-memory communication op on each start (~40-70 s
the first time on 2 cores). Building it once during `make setup` into TORCH_EXTENSIONS_DIR
(default .venv/torch_extensions) makes every later CPU training start take seconds. Built for DeepSpeed's CPU accelerator on
any machine: the CPU runs of a GPU machine (its test suite's included) load it too.
"""
import os
import time

import torch

from megatron.device import select_deepspeed_accelerator
from megatron.errors import run_cli
from megatron.process.op_cache import cache_state, set_op_cache_dir


def main() -> int:
    set_op_cache_dir()
    select_deepspeed_accelerator(torch.device("cpu"))
    start = time.perf_counter()
    # lazy: DeepSpeed picks (and logs) its accelerator on import: after the CPU one is selected
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None:
        print("DeepSpeed accelerator has no shared-memory comm op to build; nothing to do")
    else:
        cached, reason = cache_state()
        builder.load(verbose=False)
        how = "a first build" if not cached else f"built again: ninja says {reason}" if reason else "cached"
        print(f"DeepSpeed {builder.NAME} ready in {time.perf_counter() - start:.1f}s ({how}; "
              f"cache: {os.environ['TORCH_EXTENSIONS_DIR']})")
    return 0


if __name__ == "__main__":
    run_cli(main, "build_deepspeed_ops.py")  # a full disk or unwritable cache is one message
