#!/usr/bin/env python
"""The instruction mix of the attention kernels' inner loop, per kernel x scheme x bias path,
read from SASS compiled for sm_90 on this machine (no GPU): what each positional bias adds to
the work of one tile, before a GPU session is spent on timing it.

Each variant is compiled as benchmarks/compile_check.py compiles it (aligned like a typical
launch, the untuned launch configuration of kernels/tuning.py), disassembled with the nvdisasm
inside the triton wheel, and the hot loop (the unmasked band's, benchmarks/sass.py) counted.

    python tools/sass_mix.py                                   # print the table (~2 min on 2 cores)
    python tools/sass_mix.py --out docs/benchmarks.md          # rewrite the `sass` section
    python tools/sass_mix.py --kernels fwd --schemes plain kerple_log --head-dim 64
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys

from megatron.cli_args import ArgumentParser
from megatron.errors import run_cli

KERNELS = ("fwd", "bwd_dkdv", "bwd_dq")
# compile_check scheme names; a "_table" suffix is the per-distance table path (bias_table.py).
SCHEMES = ("plain", "alibi", "kerple_log", "kerple_log_table", "kerple_log_3para", "kerple_log_3para_table",
           "kerple_power_ap_")
SHOWN = ("mma", "mufu", "ldg", "ldgsts", "shared", "local", "int", "ffma", "fmul", "fadd", "fp.other", "convert")


def scheme_and_path(name: str) -> tuple[str, str]:
    if name == "plain":
        return "plain (no bias)", "-"
    if name.endswith("_table"):
        return name.removesuffix("_table"), "table"
    return name, "inline"


def measure(kernel: str, scheme: str, dtype: str, head_dim: int) -> list[dict]:
    """Compile one variant and count its hot loop: a dict of the row's figures. A variant whose
    unmasked band is split (KERPLE-log: far tiles, the hot loop at long lengths, and the near
    ones, kernels/bands.py far_split) gives a second row for its near tiles."""
    from benchmarks import sass
    from benchmarks.compile_check import compile_variant, default_launch

    (block_m, block_n), num_warps, stages = default_launch(kernel, head_dim, dtype)
    c = compile_variant(kernel, scheme, dtype, head_dim, False, aligned=True)  # the default launch
    prog = sass.parse(sass.disassemble(c.cubin))
    masked, far = sass.source_mentions("allowed"), sass.source_mentions("far_h")
    loops = {"": sass.hot_loop(prog, masked, far)}
    if any(far(x.source) for x in prog.instrs if x.source):
        loops = {"far tiles": loops[""], "near tiles": sass.hot_loop(prog, masked, far, near=True)}
    # Scores one thread holds per tile: the loop's count divided by this is the instructions each
    # thread issues per score it owns (HGMMA/HMMA are per warp group/warp, so theirs is nominal).
    per_thread = block_m * block_n / (32 * num_warps)
    rows = []
    for tiles, (first, last) in loops.items():
        counts = sass.mix(prog.instrs[first:last + 1])
        counts["mufu"] = sum(v for k, v in counts.items() if k.startswith("mufu."))
        counts["skippable"] = sass.skippable(prog, first, last)
        rows.append(dict(kernel=kernel, scheme=scheme, tiles=tiles, counts=counts, per_thread=per_thread,
                         usage=sass.resource_usage(c.cubin),
                         config=f"{block_m}x{block_n}, {num_warps} warps, {stages} stages"))
    return rows


def mufu_cell(counts) -> str:
    split = "/".join(str(counts[f"mufu.{k}"]) for k in ("ex2", "lg2", "rcp"))
    other = counts["mufu.other"]
    return f"{counts['mufu']} ({split}{f' +{other}' if other else ''})"


def table(rows: list[dict]) -> str:
    from benchmarks.report import markdown_table

    plain = {r["kernel"]: r["counts"]["total"] for r in rows if r["scheme"] == "plain"}
    headers = ["kernel", "scheme", "bias path", "regs", "stack B", "loop instr", "skipped", "per score", "vs plain",
               "MMA", "MUFU (ex2/lg2/rcp)", *[h.upper() for h in SHOWN[2:]]]
    body = []
    for r in rows:
        c = r["counts"]
        scheme, path = scheme_and_path(r["scheme"])
        path += f", {r['tiles']}" if r.get("tiles") else ""
        ratio = f"{c['total'] / plain[r['kernel']]:.2f}x" if r["kernel"] in plain else "-"
        body.append([r["kernel"], scheme, path, r["usage"]["REG"], r["usage"]["STACK"], c["total"], c["skippable"],
                     f"{c['total'] / r['per_thread']:.1f}", ratio, c["mma"], mufu_cell(c),
                     *[c[k] for k in SHOWN[2:]]])
    return markdown_table(headers, body, right=set(range(3, len(headers))))


def section(rows: list[dict], dtype: str, head_dim: int, argv: list[str]) -> str:
    import torch
    import triton

    from benchmarks.report import command_line

    configs = sorted({(r["kernel"], r["config"]) for r in rows}, key=lambda kc: KERNELS.index(kc[0]))
    return "\n".join([
        "## Inner-loop SASS instruction mix (`tools/sass_mix.py`)",
        "",
        "- device: compiled for sm_90 on a CPU machine, static counts (no GPU ran these kernels)",
        f"- triton {triton.__version__}, torch {torch.__version__}, date {datetime.date.today().isoformat()}",
        f"- command: `{command_line('tools/sass_mix.py', argv)}`",
        f"- {dtype}, head dim {head_dim}, no window, no padding, training forward (EXACT_PV); pointers and "
        "strides 16-aligned as a typical launch (compile_check `aligned`); untuned launch configurations: "
        + "; ".join(f"{k} {c}" for k, c in configs),
        "- loop instr: the instructions of one iteration of the unmasked band's loop (one tile), each "
        "counted once; per score: that count divided by the scores one thread holds per tile, "
        "BLOCK_M x BLOCK_N / (32 x warps) (32 for 128x64 on 8 warps, 16 for 32x64 or 64x32 on 4): the "
        "instructions each thread issues per score it owns; vs plain: loop instr over the plain kernel's; "
        "skipped: of those, the ones a branch in the loop jumps over on most tiles (the forward's lazy "
        "rescale of its accumulator, kernels/attention_fwd.py RESCALE_SLACK: taken only when a row's max "
        "grows by more than 2^8)",
        "- far tiles / near tiles: KERPLE-log's unmasked band is two loops (kernels/bands.py far_split): "
        "tiles far from the diagonal take the log from a series (kernels/distance_bias.py FAR_U), nearly "
        "every tile at long lengths; the near ones, within about 8 x (BLOCK_M + BLOCK_N) / 2 of the "
        "diagonal, evaluate it per score",
        "- regs / stack B: registers per thread and stack frame bytes per thread (`cuobjdump -res-usage`; "
        "a stack at 255 registers is spill space); LOCAL = LDL/STL in the loop (spill traffic)",
        "- columns: MMA = HGMMA + HMMA; LDG = global loads; LDGSTS = async global-to-shared copies (K, V "
        "tiles); SHARED = LDS/STS/LDSM/STSM; INT = integer ALU (IMAD, IADD3, LOP3, SHF, ISETP, LEA, SEL, "
        "PRMT, ...); FP.OTHER = FMNMX/FSEL/FSETP; CONVERT = F2F/F2FP/I2F(P); the rest (branches, barriers, "
        "moves, shuffles, uniform-datapath ops) is only in the total",
        "",
        table(rows),
    ])


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=list(KERNELS))
    ap.add_argument("--schemes", nargs="+", default=list(SCHEMES))
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--head-dim", type=int, default=128, help="64 or 128 (default 128: the H200 forward figures)")
    ap.add_argument("--out", help="markdown file whose section is rewritten (default: print only)")
    ap.add_argument("--section", default="sass")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        ap.error("TRITON_INTERPRET=1 is set: interpreted kernels cannot be compiled; unset it")
    from benchmarks.compile_check import SCHEMES as KNOWN

    unknown = [s for s in args.schemes if s not in KNOWN]
    if unknown:
        ap.error(f"unknown scheme(s) {', '.join(unknown)}; known: {', '.join(KNOWN)}")
    rows = []
    for kernel in args.kernels:
        for scheme in args.schemes:
            rows.extend(measure(kernel, scheme, args.dtype, args.head_dim))
            print(f"{kernel} {scheme}: {rows[-1]['counts']['total']} instructions per iteration", file=sys.stderr,
                  flush=True)
    text = section(rows, args.dtype, args.head_dim, argv)
    print(text)
    if args.out:
        from benchmarks.report import replace_section

        replace_section(args.out, args.section, text)
    return 0


if __name__ == "__main__":
    run_cli(main, "sass_mix.py")
