"""The instruction mix of the attention kernels' inner loop, per kernel x scheme x bias path,
read from SASS compiled for sm_90 on this machine (no GPU): what each positional bias adds to
the work of one tile, before a GPU session is spent on timing it.

Each variant is compiled as benchmarks/compile_check.py compiles it (aligned like a typical
launch, the untuned launch configuration of kernels/tuning.py), disassembled with the nvdisasm
inside the triton wheel, and the hot loop (the unmasked band's, benchmarks/sass.py) counted.

    python tools/sass_mix.py                                   # print the table (~2 min on 2 cores)
    python tools/sass_mix.py --out docs/benchmarks.md          # rewrite the `sass` section
    python tools/sass_mix.py --kernels fwd --schemes plain kerple_log --head-dim 64

--model: a cost estimate per (length, head dim, scheme) instead of the mix. The kernels walk three
kinds of tile differently (the diagonal's masked tiles, unmasked near ones, KERPLE-log's far ones:
kernels/bands.py), so a whole kernel's static count says little; the estimate is, per kernel,
sum over kinds of (instructions of that kind's loop x tiles of that kind at the length,
benchmarks/tile_counts.py) + programs x (instructions outside the loops), times the warps: warp
instructions issued per (batch, head), against plain and ALiBi, beside the H200's timings:

    python tools/sass_mix.py --model --out docs/benchmarks.md                # section sass-model
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys

from benchmarks import sass
from benchmarks.tile_counts import kernel_tiles
from megatron.cli_args import ArgumentParser

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
    # lazy: torch and triton; --help and flag errors need none
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
    from benchmarks.report import markdown_table  # lazy: torch (benchmarks/report.py); --help needs none

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
    # lazy: torch and triton, for the section's versions
    import torch
    import triton

    from benchmarks.report import command_line  # lazy: torch (benchmarks/report.py); --help needs none

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


# --model: the schemes and lengths of issue 42's question (512: the 162M training step's length).
MODEL_SCHEMES = ("plain", "alibi", "kerple_log")
MODEL_LENGTHS = (512, 2048, 4096, 8192, 16384, 32768, 65536)
LEARNED = {"kerple_log"}  # parameters with gradients: the training forward runs EXACT_PV (kernels/attention.py)
# The H200's timings these estimates are read against (docs/benchmarks.md section attention-inline,
# 2026-11-27 afternoon; bf16, head dim 64, untuned launch configurations, the inline bias path):
# (pass, L) -> {scheme: (speed as a multiple of FlexAttention ALiBi's, TFLOP/s)}, our kernel.
H200 = {("fwd+bwd", 2048): {"kerple_log": (0.84, 77.5), "alibi": (1.08, 99.1)},
        ("fwd+bwd", 8192): {"kerple_log": (1.25, 143), "alibi": (1.78, 203)},
        ("fwd", 2048): {"kerple_log": (0.89, 48.4), "alibi": (1.20, 64.8)},
        ("fwd", 8192): {"kerple_log": (1.30, 113), "alibi": (1.85, 161)},
        ("fwd", 32768): {"kerple_log": (1.85, 206), "alibi": (2.86, 318)}}
# Warp instructions an H200 can issue per second: 132 SMs x 4 schedulers x 1.98 GHz (its
# nvidia-smi max SM clock in the GPU check), one instruction per scheduler per cycle.
H200_ISSUE_PER_S = 132 * 4 * 1.98e9


def flops_per_head(mode: str, length: int, head_dim: int) -> float:
    """bench_attention's causal count per (batch, head): fwd 4 L^2 D / 2, fwd+bwd 3.5x that."""
    fwd = 4 * length * length * head_dim / 2
    return fwd if mode == "fwd" else 3.5 * fwd


def tile_costs(kernel: str, scheme: str, dtype: str, head_dim: int, exact_pv: bool) -> dict:
    """Compile one variant; the instructions of each kind of tile's loop (one iteration), the ones
    outside every band loop (a program's own: loading its block, storing its results), the
    forward's lazily skipped rescale per loop, and the launch (blocks, warps)."""
    # lazy: torch and triton; --help and flag errors need none
    from benchmarks.compile_check import compile_variant, default_launch

    (block_m, block_n), num_warps, _ = default_launch(kernel, head_dim, dtype)
    c = compile_variant(kernel, scheme, dtype, head_dim, False, aligned=True, exact_pv=exact_pv)
    prog = sass.parse(sass.disassemble(c.cubin))
    bands = sass.band_loops(prog, sass.source_mentions("allowed"), sass.source_mentions("far_h"))
    # The diagonal's tiles: the forward and dq walk keys up to the diagonal (its masked band is
    # the last loop; the first one, before the unmasked band, is empty in a causal call and
    # compiled away), dk/dv walks queries from the diagonal (its first masked band).
    masked = bands["masked"][0 if kernel == "bwd_dkdv" else -1]
    loops = {"masked": masked, "near": bands["near"][0]}
    if bands["far"]:
        loops["far"] = bands["far"][0]
    cost = {"blocks": (block_m, block_n), "warps": num_warps}
    for kind, (first, last) in loops.items():
        n = last - first + 1
        # unmasked forward tiles rarely take the lazy rescale; the diagonal's are counted whole
        cost[kind] = n - (sass.skippable(prog, first, last) if kind != "masked" else 0)
    inside = sum(b - a + 1 for kind in bands.values() for a, b in kind)
    cost["outside"] = len(prog.instrs) - inside
    return cost


def kernel_estimate(cost: dict, kernel: str, length: int, r2: float) -> float:
    """Warp instructions of one kernel per (batch, head) at `length`."""
    t = kernel_tiles(kernel, length, *cost["blocks"], far="far" in cost, r2=r2)
    per_warp = t.masked * cost["masked"] + t.near * cost["near"] + t.far * cost.get("far", 0)
    return cost["warps"] * (per_warp + t.programs * cost["outside"])


def model_costs(head_dims: list[int], dtype: str) -> dict:
    """{(head_dim, scheme, kernel): tile_costs}, kernel "fwd_train" for a training forward (EXACT_PV
    where the scheme learns) and "fwd" for inference."""
    costs = {}
    for hd in head_dims:
        for scheme in MODEL_SCHEMES:
            for kernel in ("fwd", "fwd_train", "bwd_dkdv", "bwd_dq"):
                if kernel == "fwd_train" and scheme not in LEARNED:
                    costs[(hd, scheme, kernel)] = costs[(hd, scheme, "fwd")]  # the same launch
                    continue
                costs[(hd, scheme, kernel)] = tile_costs(kernel.removesuffix("_train"), scheme, dtype, hd,
                                                         exact_pv=kernel == "fwd_train")
                print(f"model: head dim {hd} {scheme} {kernel}: {costs[(hd, scheme, kernel)]}", file=sys.stderr,
                      flush=True)
    return costs


MODES = {"fwd": ("fwd",), "fwd+bwd": ("fwd_train", "bwd_dkdv", "bwd_dq"),
         # a training step under activation checkpointing runs the forward twice (the recomputation)
         "checkpointed step": ("fwd_train", "fwd_train", "bwd_dkdv", "bwd_dq")}


def estimate(costs: dict, hd: int, scheme: str, mode: str, length: int, r2: float) -> float:
    return sum(kernel_estimate(costs[(hd, scheme, k)], k.removesuffix("_train"), length, r2) for k in MODES[mode])


def millions(x: float) -> str:
    return f"{x / 1e6:,.0f}" if x >= 1e9 else f"{x / 1e6:.3g}"


def model_table(costs: dict, hd: int, lengths: list[int], r2: float) -> str:
    from benchmarks.report import markdown_table  # lazy: torch (benchmarks/report.py); --help needs none

    rows = []
    for mode in ("fwd", "fwd+bwd"):
        for n in lengths:
            e = {s: estimate(costs, hd, s, mode, n, r2) for s in MODEL_SCHEMES}
            k_over_a = e["kerple_log"] / e["alibi"]
            measured = H200.get((mode, n)) if hd == 64 else None
            h200, predicted, issue = "-", "-", "-"
            if measured:
                (kerple, kerple_tf), (alibi, alibi_tf) = measured["kerple_log"], measured["alibi"]
                h200 = f"{kerple:.2f}x / {alibi:.2f}x ({alibi / kerple:.2f})"
                predicted = f"{alibi / k_over_a:.2f}x"
                use = {s: tf * 1e12 / flops_per_head(mode, n, hd) * e[s] / H200_ISSUE_PER_S
                       for s, tf in (("alibi", alibi_tf), ("kerple_log", kerple_tf))}
                issue = f"{use['alibi']:.0%} / {use['kerple_log']:.0%}"
            rows.append([mode, f"{n:,}", millions(e["plain"]), f"{e['alibi'] / e['plain']:.2f}",
                         f"{e['kerple_log'] / e['plain']:.2f}", f"{k_over_a:.2f}", h200, predicted, issue])
    headers = ["pass", "L", "plain: M warp-instr per (batch, head)", "alibi / plain", "kerple_log / plain",
               "kerple_log / alibi", "H200: kerple_log / alibi speed vs Flex ALiBi (time ratio)",
               "kerple_log vs Flex ALiBi, predicted", "H200 issue-slot use: alibi / kerple_log"]
    return markdown_table(headers, rows, right=set(range(1, len(headers))))


def tile_table(costs: dict, head_dims: list[int]) -> str:
    from benchmarks.report import markdown_table  # lazy: torch (benchmarks/report.py); --help needs none

    rows = []
    for hd in head_dims:
        for kernel in ("fwd", "fwd_train", "bwd_dkdv", "bwd_dq"):
            for scheme in MODEL_SCHEMES:
                c = costs[(hd, scheme, kernel)]
                if kernel == "fwd_train" and scheme not in LEARNED:
                    continue
                rows.append([hd, kernel, scheme, f"{c['blocks'][0]}x{c['blocks'][1]}, {c['warps']} warps",
                             c["masked"], c["near"], c.get("far", "-"), c["outside"]])
    return markdown_table(["head dim", "kernel", "scheme", "tile", "masked", "near", "far", "outside the loops"],
                          rows, right={0, 4, 5, 6, 7})


def model_section(costs: dict, head_dims: list[int], lengths: list[int], r2: float, dtype: str,
                  argv: list[str]) -> str:
    # lazy: torch and triton, for the section's versions
    import torch
    import triton

    from benchmarks.report import command_line  # lazy: torch (benchmarks/report.py); --help needs none

    lines = [
        "## Estimated kernel cost per length (`tools/sass_mix.py --model`)",
        "",
        "- device: compiled for sm_90 on a CPU machine, static counts times tile counts (no GPU ran these kernels)",
        f"- triton {triton.__version__}, torch {torch.__version__}, date {datetime.date.today().isoformat()}",
        f"- command: `{command_line('tools/sass_mix.py', argv)}`",
        f"- {dtype}, no window, no padding, queries = keys = L, untuned launch configurations; r2 = {r2:g} for "
        "KERPLE-log's far distance (kernels/distance_bias.py far_distance: 1 / r2 positions nearer for larger r2)",
        "- a kernel's estimate: warps x (sum over the kinds of tile (masked: the diagonal's; near; far: KERPLE-log's "
        "series) of the kind's loop instructions x its tiles at L (benchmarks/tile_counts.py) + programs x the "
        "instructions outside the loops); the forward's unmasked tiles without the lazy rescale (skipped on most), "
        "the diagonal's with it; fwd: the inference forward; fwd+bwd: the training forward (EXACT_PV where the "
        "scheme learns: kerple_log) + dk/dv + dq",
        "- ratios are estimated instructions (a time ratio if time followed issued instructions); the H200 column: "
        "speed as a multiple of FlexAttention ALiBi's, KERPLE-log / our ALiBi (head dim 64, section attention-inline), "
        "with KERPLE-log's time over our ALiBi's, the measured counterpart of `kerple_log / alibi`; predicted: our "
        "ALiBi's measured multiple divided by the estimated kerple_log / alibi; issue-slot use: the estimated warp "
        "instructions at the measured TFLOP/s over what the H200 can issue (132 SMs x 4 schedulers x 1.98 GHz)",
        "",
    ]
    for hd in head_dims:
        lines += [f"**Head dim {hd}:**", "", model_table(costs, hd, lengths, r2), ""]
    if 64 in head_dims:  # the 162M model's attention: head dim 64, L = 512, activation checkpointing
        step = {s: estimate(costs, 64, s, "checkpointed step", 512, r2) for s in MODEL_SCHEMES}
        lines += ["The 162M training step's attention (head dim 64, L = 512, activation checkpointing: the "
                  "training forward twice, dk/dv, dq; every tile masked or near): kerple_log / alibi "
                  f"{step['kerple_log'] / step['alibi']:.2f}, kerple_log / plain {step['kerple_log'] / step['plain']:.2f}, "
                  f"alibi / plain {step['alibi'] / step['plain']:.2f} (estimated instructions).", ""]
    lines += ["Instructions per tile (one loop iteration per thread) and per program, by kernel and kind:", "",
              tile_table(costs, head_dims)]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=list(KERNELS))
    ap.add_argument("--schemes", nargs="+", default=list(SCHEMES))
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--head-dim", type=int, default=128, help="64 or 128 (default 128: the H200 forward figures)")
    ap.add_argument("--model", action="store_true",
                    help="estimate each kernel's instructions per length (plain, alibi, kerple_log) instead of the mix")
    ap.add_argument("--head-dims", nargs="+", type=int, default=[64, 128], help="--model: head dims (default 64 128)")
    ap.add_argument("--lengths", nargs="+", type=int, default=list(MODEL_LENGTHS), help="--model: sequence lengths")
    ap.add_argument("--r2", type=float, default=1.0, help="--model: KERPLE-log's r2 for its far distance (default 1)")
    ap.add_argument("--out", help="markdown file whose section is rewritten (default: print only)")
    ap.add_argument("--section", default=None, help="section name in --out (default sass; sass-model with --model)")
    args = ap.parse_args(argv)
    args.section = args.section or ("sass-model" if args.model else "sass")
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        ap.error("TRITON_INTERPRET=1 is set: interpreted kernels cannot be compiled; unset it")
    from benchmarks.compile_check import SCHEMES as KNOWN  # lazy: torch and triton; --help and flag errors need none

    unknown = [s for s in args.schemes if s not in KNOWN]
    if unknown:
        ap.error(f"unknown scheme(s) {', '.join(unknown)}; known: {', '.join(KNOWN)}")
    if args.model:
        bad = [n for n in args.lengths + args.head_dims if n < 1]
        if bad or args.r2 < 1e-2:
            ap.error(f"--lengths and --head-dims must be >= 1 and --r2 >= 0.01 (KERPLE's clamp); got "
                     f"{bad[0] if bad else args.r2}")
        text = model_section(model_costs(args.head_dims, args.dtype), args.head_dims, args.lengths, args.r2,
                             args.dtype, argv)
        print(text)
        if args.out:
            from benchmarks.report import replace_section  # lazy: torch (benchmarks/report.py); --help needs none

            replace_section(args.out, args.section, text)
        return 0
    rows = []
    for kernel in args.kernels:
        for scheme in args.schemes:
            rows.extend(measure(kernel, scheme, args.dtype, args.head_dim))
            print(f"{kernel} {scheme}: {rows[-1]['counts']['total']} instructions per iteration", file=sys.stderr,
                  flush=True)
    text = section(rows, args.dtype, args.head_dim, argv)
    print(text)
    if args.out:
        from benchmarks.report import replace_section  # lazy: torch (benchmarks/report.py); --help needs none

        replace_section(args.out, args.section, text)
    return 0
