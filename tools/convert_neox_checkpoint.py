#!/usr/bin/env python
"""Convert a NeoX / KERPLE checkpoint (2022 pipeline layer files or the current sequential
layout, any tensor-parallel degree, bf16/fp16/fp32) into this stack's TP=1 layout.

    python tools/convert_neox_checkpoint.py --input kerple_ckpts/ --output converted/
    python tools/convert_neox_checkpoint.py --input CKPT --output OUT --config my_neox.yml --iteration 50000
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron.errors import run_cli  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", required=True, help="NeoX checkpoint directory holding `latest` and global_step<N>/")
    p.add_argument("--output", required=True, help="where to write the converted checkpoint")
    p.add_argument("--iteration", type=int, default=None, help="convert global_step<N> instead of latest")
    p.add_argument("--config", nargs="+", default=None,
                   help="the NeoX YAML files (default: the checkpoint's global_step<N>/configs/*.yml)")
    from megatron.config.precision import DTYPE_NAMES, torch_dtype
    from megatron.interop.safe_load import add_load_flags

    p.add_argument("--dtype", choices=DTYPE_NAMES, default="fp32")

    add_load_flags(p)
    args = p.parse_args(argv)
    from megatron.interop.convert import convert_neox_checkpoint

    dtype = torch_dtype(args.dtype)
    tag = f"global_step{args.iteration}" if args.iteration is not None else None
    out = convert_neox_checkpoint(args.input, args.output, tag, args.config, args.trust_checkpoint, dtype,
                                  args.allow_nonfinite)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    run_cli(main, "convert_neox_checkpoint.py", expected=(ValueError,))
