#!/usr/bin/env python
"""Compile the Triton attention kernels for CUDA targets on a machine without a GPU and print a
table (compile time, shared memory per program): catches code the interpreter accepts but
compiled Triton rejects, before a GPU session is spent on it.

    python tools/check_triton_compile.py                      # every variant for sm_90 (~10 min on 2 cores)
    python tools/check_triton_compile.py --arch 80 90 --schemes kerple_log rpe --dtypes bf16
"""
from __future__ import annotations

import argparse
import os

from megatron.cli_args import ArgumentParser
from megatron.config.precision import DTYPE_NAMES
from megatron.errors import run_cli

KERNELS = ("fwd", "bwd_dkdv", "bwd_dq")
SCHEMES = ("plain", "kerple_log", "kerple_log_3para", "kerple_power_ap_", "kerple_power_ap_ap", "alibi", "rpe")

SHARED_LIMIT = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024}  # bytes per block (opt-in max)


def main(argv=None) -> int:
    ap = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", type=int, nargs="+", default=[90], help="compute capabilities, e.g. 80 90")
    ap.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=list(KERNELS))
    ap.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=list(SCHEMES))
    ap.add_argument("--dtypes", nargs="+", default=sorted(DTYPE_NAMES), choices=DTYPE_NAMES)
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--quick", action="store_true", help="the representative variants the tests compile (compile_check.QUICK)")
    args = ap.parse_args(argv)
    for arch in args.arch:
        if arch not in SHARED_LIMIT:
            ap.error(f"--arch {arch}: known compute capabilities are {', '.join(map(str, SHARED_LIMIT))}")
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        ap.error("TRITON_INTERPRET=1 is set: interpreted kernels cannot be compiled; unset it")
    # lazy: torch and triton; the flag checks above need none
    from benchmarks.compile_check import QUICK, all_variants, compile_variant

    if args.quick:
        variants = QUICK
    else:
        variants = [(*v[:5], arch, v[5], 1, False) for arch in args.arch for v in all_variants(
            args.schemes, args.dtypes, args.head_dims, (False, True), args.kernels, (False, True))]
    print("| kernel | scheme | dtype | head dim | window | padded | group | documents | target | compile s | shared KiB "
          "| fits |")
    print("|---|---|---|---:|---|---|---:|---|---|---:|---:|---|")
    failures = 0
    for kernel, scheme, dtype, hd, window, arch, padded, group, docs in variants:
        try:
            c = compile_variant(kernel, scheme, dtype, hd, window, arch=arch, padded=padded, group=group,
                                documents=docs)
        except Exception as err:  # a compile error is the finding: report it and go on
            failures += 1
            print(f"| {kernel} | {scheme} | {dtype} | {hd} | {window} | {padded} | {group} | {docs} | sm_{arch} | error: "
                  f"{str(err).strip().splitlines()[-1][:120]} | | |", flush=True)
            continue
        fits = "yes" if c.shared_bytes <= SHARED_LIMIT[arch] else "NO"
        failures += fits == "NO"
        print(f"| {kernel} | {scheme} | {dtype} | {hd} | {window} | {padded} | {group} | {docs} | {c.target} | "
              f"{c.seconds:.1f} | "
              f"{c.shared_bytes / 1024:.0f} | {fits} |", flush=True)
    print(f"\n{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    run_cli(main, "check_triton_compile.py")
