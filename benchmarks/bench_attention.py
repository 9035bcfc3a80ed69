"""Attention-only benchmark: every registered backend on the positional schemes asked for, plus
the baselines measured in the same process, as one markdown table.

Shapes follow FlashAttention's benchmark: head dim 64, 12 heads, batch B = tokens // L so every
length processes the same 16k tokens, causal. FLOPs count the causal half of the score matrix:
forward 4*B*H*L*L*D / 2, backward 2.5x forward, so fwd+bwd = 3.5x forward.

Rows (each skipped with its reason when resolve_backend refuses the case, so new backends in
megatron/attention/ are picked up with no edit here):
    SCHEME on every registered backend (--backends restricts), always incl. flex and reference;
                      on triton once per bias path with --triton-bias both (table / inline,
                      megatron/attention/kernels/bias_table.py) where the path changes what the kernel does
    none on sdpa      SDPA without a bias (is_causal)                  -- the last-resort baseline
    alibi on flash    flash-attn with alibi_slopes, if installed       -- the baseline when it runs
    alibi on flex     FlexAttention with ALiBi's score_mod (fixed slopes) -- the baseline without
                      flash-attn: what a user would run instead
"fwd" is an inference forward (torch.no_grad, backend resolved with training=False: evaluation
at long lengths); "fwd+bwd" resolves with training=True and backpropagates into q, k, v and the
scheme's parameters. --fwd-only-lengths are measured forward only (eval-length check).
Above the detailed table, two summaries (fwd+bwd, fwd) put the baselines and every triton row
side by side per length, as issue 22's table does. A cell slower than --max-call-seconds per
call is reported from that one call, and the case's longer lengths are skipped (FlexAttention
with learnable captured parameters takes seconds per backward), so one command fits a GPU slot.

    python tools/bench_attention.py --quick                                  # CPU smoke, < 1 min
    python tools/bench_attention.py --triton-bias both --out docs/benchmarks.md --section attention   # GPU
    python tools/bench_attention.py --schemes kerple_log kerple_power_ap_ alibi --lengths 2048 8192

On CPU keep lengths small: a materialising backend (reference, sdpa with a bias) needs
B*H*L*L floats, and running out of host RAM kills the process instead of filling an OOM cell.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field

import torch

from benchmarks.budget import TimeBudget
from benchmarks.cli import check_names, check_positive, pick_device, set_threads
from benchmarks.report import SECTION_NAME, environment_lines, mark_partial, markdown_table, replace_section
from benchmarks.timing import (
    error_cell,
    median_seconds,
    peak_memory_gib,
    release_memory,
    reset_peak_memory,
)
from megatron.attention import backend_names, resolve_backend
from megatron.attention.kernels.bias_table import bias_path
from megatron.attention.registry import backend_classes
from megatron.cli_args import ArgumentParser
from megatron.config.precision import DTYPE_NAMES, torch_dtype
from megatron.positional.base import PositionalSpec
from megatron.positional.registry import build_scheme, scheme_names

# One scheme per kind of work the fused kernel does (log / power / linear / lookup bias, weight,
# both), the paper's first; kerple_power_original is ALiBi's kind with other slopes.
FUSED_SCHEMES = ["kerple_log", "kerple_power_ap_", "alibi", "rpe", "sandwich", "kerple_log_3para",
                 "kerple_power_ap_ap", "kerple_power__ap"]
DEFAULTS = {"lengths": [512, 1024, 2048, 4096, 8192, 16384], "fwd_only_lengths": [32768, 65536],
            "tokens": 16384, "warmup": 3, "reps": 10, "schemes": FUSED_SCHEMES, "max_call_seconds": 2.0}
QUICK = {"lengths": [128, 256], "fwd_only_lengths": [512], "tokens": 2048, "warmup": 1, "reps": 3, "threads": 1,
         "schemes": ["kerple_log"], "max_call_seconds": 30.0}
# Measured in every run; they are rows like any other, skipped with a reason where they cannot run.
NO_BIAS = ("none", "sdpa")
FLASH_ALIBI = ("alibi", "flash")
FLEX_ALIBI = ("alibi", "flex")
BASELINE_ROWS = (NO_BIAS, FLASH_ALIBI, FLEX_ALIBI)
BASELINE_ORDER = (FLASH_ALIBI, FLEX_ALIBI, NO_BIAS)  # auto: the first whose fwd+bwd ran
ALWAYS_BACKENDS = ("flex", "reference")  # "FlexAttention with the same scheme", "the materialised reference"
LABELS = {NO_BIAS: "SDPA no-bias", FLASH_ALIBI: "flash-attn ALiBi", FLEX_ALIBI: "FlexAttention ALiBi"}
BIAS_ENV = "KERPLE_TRITON_BIAS"  # megatron/attention/kernels/bias_table.py


@dataclass
class Row:
    scheme: str
    backend: str
    length: int | None  # None: the whole case was skipped
    variant: str | None = None  # triton's bias path (table / inline) when --triton-bias both/table/inline
    batch: int = 0
    fwd_s: float | None = None
    fb_s: float | None = None
    fwd_tflops: float | None = None
    fb_tflops: float | None = None
    fwd_ratio: float | None = None
    fb_ratio: float | None = None
    peak_gib: float | None = None
    fwd_cell: str = "-"  # the ms cell when fwd_s is None: 'OOM', 'error' (text in notes), 'refused'
    fb_cell: str = "-"  # likewise, or 'fwd only' for --fwd-only-lengths
    notes: list[str] = field(default_factory=list)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", type=int, nargs="+", default=None,
                   help=f"sequence lengths for fwd and fwd+bwd (default {DEFAULTS['lengths']})")
    p.add_argument("--fwd-only-lengths", type=int, nargs="*", default=None,
                   help=f"extra lengths measured forward only (default {DEFAULTS['fwd_only_lengths']}; "
                        "give the flag with no value for none)")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--tokens", type=int, default=None,
                   help=f"tokens per batch: B = max(1, tokens // L) (default {DEFAULTS['tokens']})")
    p.add_argument("--dtype", choices=sorted(DTYPE_NAMES), default=None, help="default bf16 on CUDA, fp32 on CPU")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu or cuda[:N]")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's own; --quick: 1, steadier on a shared machine)")
    p.add_argument("--schemes", nargs="+", default=None,
                   help=f"positional schemes (pos-emb names; default every fused one: {' '.join(FUSED_SCHEMES)}; "
                        "--quick: kerple_log)")
    p.add_argument("--triton-bias", choices=("default", "table", "inline", "both"), default="default",
                   help="the triton kernel's bias path (KERPLE_TRITON_BIAS): default = the library's choice "
                        "(auto), both = one row per path where it matters")
    p.add_argument("--autotune", action="store_true",
                   help="KERPLE_TRITON_AUTOTUNE=1: the triton kernel times its candidate configurations at the "
                        "first call of each shape (in the warmup) and caches the fastest (megatron/attention/kernels/tuning.py)")
    p.add_argument("--max-call-seconds", type=float, default=None,
                   help="a cell whose first timed call takes longer reports that call alone and skips the "
                        "case's longer lengths (default 2; --quick: 30)")
    p.add_argument("--backends", nargs="+", default=None,
                   help="backends to run the schemes on (default: every registered one); flex and "
                        "reference and the baselines are measured regardless")
    p.add_argument("--skip-backends", nargs="+", default=[], metavar="BACKEND",
                   help="never measure these, even those measured regardless (e.g. reference: the "
                        "materialised bias, minutes and an out-of-memory at 32k on a GPU)")
    p.add_argument("--baseline", default="auto",
                   help="SCHEME:BACKEND whose TFLOP/s the ratios divide by (default: alibi:flash if its "
                        "fwd+bwd runs here, else alibi:flex, else none:sdpa)")
    p.add_argument("--warmup", type=int, default=None, help=f"untimed calls per cell (default {DEFAULTS['warmup']})")
    p.add_argument("--reps", type=int, default=None, help=f"timed calls per cell, median kept (default {DEFAULTS['reps']})")
    p.add_argument("--quick", action="store_true",
                   help=f"CPU smoke test: {QUICK} in fp32 on CPU (explicit options still win)")
    p.add_argument("--out", default=None, help="markdown file whose section to rewrite (e.g. docs/benchmarks.md)")
    p.add_argument("--section", default="attention", help="section name in --out (default attention)")
    p.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="start no cell after this many seconds; the rest are marked 'skipped: out of time' "
                        "(the baselines run first, so the ratios survive a short budget)")
    args = p.parse_args(argv)

    base = QUICK if args.quick else DEFAULTS
    for key, value in base.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    set_threads(p, args.threads)
    args.device = pick_device(p, "cpu" if args.quick and args.device == "auto" else args.device)
    if args.dtype is None:
        args.dtype = "bf16" if args.device.type == "cuda" else "fp32"
    check_positive(p, lengths=args.lengths, fwd_only_lengths=args.fwd_only_lengths, head_dim=args.head_dim,
                   heads=args.heads, tokens=args.tokens, reps=args.reps)
    if args.max_call_seconds <= 0:
        p.error(f"--max-call-seconds must be > 0, got {args.max_call_seconds}")
    if args.warmup < 0:
        p.error(f"--warmup must be >= 0, got {args.warmup}")
    if args.time_budget is not None and args.time_budget <= 0:
        p.error(f"--time-budget must be > 0 seconds, got {args.time_budget}")
    check_names(p, args.schemes, scheme_names(), "positional scheme")
    registered = backend_names()
    args.backends = registered if args.backends is None else args.backends
    check_names(p, args.backends, registered, "attention backend")
    check_names(p, args.skip_backends, registered, "attention backend")
    if args.baseline != "auto":
        if args.baseline.count(":") != 1:
            p.error(f"--baseline {args.baseline!r} must look like SCHEME:BACKEND, e.g. none:sdpa")
        b_scheme, b_backend = args.baseline.split(":")
        check_names(p, [b_scheme], scheme_names(), "baseline scheme")
        check_names(p, [b_backend], registered, "baseline backend")
        args.baseline = (b_scheme, b_backend)
    if not SECTION_NAME.match(args.section):
        p.error(f"--section {args.section!r}: use lower-case letters, digits, '_' or '-'")
    args.argv = list(argv)
    args.budget = TimeBudget(args.time_budget)  # its clock starts here, before any compile
    return args


def cases(args) -> list[tuple[str, str, str | None]]:
    """(scheme, backend, triton bias path or None) in table order, each once."""
    out = []
    for scheme in args.schemes:
        for backend in [*args.backends, *ALWAYS_BACKENDS]:
            if backend not in args.skip_backends:
                out += [(scheme, backend, v) for v in variants(scheme, backend, args)]
    for pair in [*BASELINE_ROWS, *([args.baseline] if isinstance(args.baseline, tuple) else [])]:
        out += [(*pair, v) for v in variants(*pair, args)]
    return list(dict.fromkeys(out))


def variants(scheme: str, backend: str, args) -> list[str | None]:
    """The triton bias paths to measure for this case: [None] (the library default, or a case the
    option does not change), or the paths asked for."""
    if backend != "triton" or args.triton_bias == "default":
        return [None]

    kernel = build(scheme, args, 16, device="cpu").fused_kernel()
    if kernel is None or bias_path(kernel, "table") == bias_path(kernel, "inline"):
        return [None]
    if args.triton_bias != "both":
        return [args.triton_bias]
    default = bias_path(kernel, "auto")
    return [default, *({"table", "inline"} - {default})]  # the library's path first


def priority(args):
    """Sort key for the order cases are measured in: the baselines first (without them no ratio
    means anything), then our kernel on the bias path the library picks (what users get), then its
    other path, then the rest; a short --time-budget cuts the end."""
    baselines = [*BASELINE_ROWS, *([args.baseline] if isinstance(args.baseline, tuple) else [])]

    def key(case):
        if case[:2] in baselines:
            return 0
        if case[1] != "triton":
            return 3
        return 1 if case[2] is None or case[2] == variants(*case[:2], args)[0] else 2
    return key


def build(scheme_name: str, args, max_len: int, device=None):
    torch.manual_seed(0)  # same scheme parameters for every backend
    spec = PositionalSpec(num_heads=args.heads, head_dim=args.head_dim, hidden_size=args.heads * args.head_dim,
                          max_position_embeddings=max_len)
    return build_scheme(scheme_name, spec).to(device or args.device)


def resolve(backend: str, scheme, args, training: bool):
    """(backend object, None), or (None, why not): resolve_backend's ValueError is a refusal; any
    other exception is a bug in that backend, reported in its row rather than ending the sweep."""
    if backend not in backend_names():
        return None, f"backend {backend!r} is not registered in megatron/attention/"
    dtype = torch_dtype(args.dtype)
    try:
        return resolve_backend(backend, scheme, args.device, dtype, training=training), None
    except ValueError as e:
        # The backend's own sentence is the useful part of resolve_backend's longer message.
        reason = backend_classes()[backend]().unsupported_reason(scheme, args.device, dtype, training)
        return None, reason or str(e)
    except Exception as e:
        return None, error_cell(e)


def fwd_flops(batch: int, heads: int, length: int, head_dim: int) -> float:
    """Causal forward FLOPs as FlashAttention's benchmark counts them (QK^T and PV, half the matrix)."""
    return 4.0 * batch * heads * length * length * head_dim / 2


def measure(backend, scheme, args, length: int, batch: int, train: bool) -> tuple[float, bool]:
    """(median seconds of one forward (no_grad) or forward+backward call at this length, slow):
    slow when the first timed call took more than --max-call-seconds, which is then the figure."""
    dev, dtype = args.device, torch_dtype(args.dtype)
    shape = (batch, args.heads, length, args.head_dim)
    q, k, v = (torch.randn(shape, device=dev, dtype=dtype, requires_grad=train) for _ in range(3))
    pos = torch.arange(length, device=dev)
    params = list(scheme.parameters())

    def forward():
        qr, kr = scheme.rotate_qk(q, k, pos, pos)  # charged to the scheme (rotary), a no-op otherwise
        return backend.forward(qr, kr, v, scheme, pos, pos)

    if not train:
        def step():
            with torch.no_grad():
                forward()
    else:
        grad_out = torch.randn(shape, device=dev, dtype=dtype)

        def step():
            for t in (q, k, v, *params):
                t.grad = None
            forward().backward(grad_out)
    if args.warmup:
        step()  # compiles (triton, flex) and, with --autotune, tunes: never timed
    first = median_seconds(step, dev, 0, 1)
    if first > args.max_call_seconds:
        return first, True
    return median_seconds(step, dev, max(args.warmup - 1, 0), args.reps), False


def run_cell(row: Row, backend, scheme, args, train: bool) -> bool:
    """Measure one cell into the row; True when it was too slow to measure longer lengths."""
    flops = fwd_flops(row.batch, args.heads, row.length, args.head_dim) * (3.5 if train else 1.0)
    slow = False
    try:
        seconds, slow = measure(backend, scheme, args, row.length, row.batch, train)
        if slow:
            row.notes.append(f"{'fwd+bwd' if train else 'fwd'}: one call (> {args.max_call_seconds:g} s)")
        tflops = flops / seconds / 1e12
        if train:
            row.fb_s, row.fb_tflops = seconds, tflops
        else:
            row.fwd_s, row.fwd_tflops = seconds, tflops
    except Exception as e:  # one bad cell (OOM, a kernel bug) must not end the sweep
        text = error_cell(e)
        short = "OOM" if text == "OOM" else "error"
        if train:
            row.fb_cell = short
        else:
            row.fwd_cell = short
        if short != "OOM":
            row.notes.append(f"{'fwd+bwd' if train else 'fwd'} {text}")
    finally:
        release_memory(args.device)
    return slow


def run_case(scheme_name: str, backend_name: str, args, progress, variant: str | None = None) -> list[Row]:
    """The case's rows; a triton bias path (variant) is set in the environment while it runs."""
    saved = os.environ.get(BIAS_ENV)
    if variant is not None:
        os.environ[BIAS_ENV] = variant
    try:
        rows = _run_case(scheme_name, backend_name, args, progress)
    finally:
        if variant is not None:
            if saved is None:
                os.environ.pop(BIAS_ENV, None)
            else:
                os.environ[BIAS_ENV] = saved
    for r in rows:
        r.variant = variant
    return rows


def _run_case(scheme_name: str, backend_name: str, args, progress) -> list[Row]:
    lengths = [(n, True) for n in args.lengths] + [(n, False) for n in args.fwd_only_lengths]
    if args.budget.expired():  # not even the scheme is built (a compile can take tens of seconds)
        return [Row(scheme_name, backend_name, None, notes=[args.budget.skip_note()])]
    try:
        scheme = build(scheme_name, args, max(n for n, _ in lengths))
    except Exception as e:
        return [Row(scheme_name, backend_name, None, notes=[f"scheme not built: {error_cell(e)}"])]
    infer, infer_reason = resolve(backend_name, scheme, args, training=False)
    trainer, train_reason = resolve(backend_name, scheme, args, training=True)
    if infer is None and trainer is None:
        note = f"skipped: {train_reason}" if train_reason == infer_reason else \
            f"skipped: inference: {infer_reason}; training: {train_reason}"
        return [Row(scheme_name, backend_name, None, notes=[note])]
    rows = []
    slow = {False: None, True: None}  # train? -> the length whose one call exceeded the limit
    budget = args.budget
    for length, with_backward in sorted(lengths):
        row = Row(scheme_name, backend_name, length, batch=max(1, args.tokens // length))
        if infer is None:
            row.fwd_cell, row.notes = "refused", [f"inference refused: {infer_reason}"]
        elif budget.expired():
            row.fwd_cell, row.notes = "skipped", [f"fwd {budget.skip_note()}"]
        elif slow[False] is not None:
            row.fwd_cell = "skipped"
            row.notes.append(f"fwd skipped: > {args.max_call_seconds:g} s per call at L={slow[False]}")
        else:
            progress(f"{scheme_name}/{backend_name} L={length} fwd")
            reset_peak_memory(args.device)
            if run_cell(row, infer, scheme, args, train=False):
                slow[False] = length
            row.peak_gib = peak_memory_gib(args.device)
        if not with_backward:
            row.fb_cell = "fwd only"
        elif trainer is None:
            row.fb_cell, row.notes = "refused", row.notes + [f"training refused: {train_reason}"]
        elif budget.expired():
            row.fb_cell = "skipped"
            row.notes.append(f"fwd+bwd {budget.skip_note()}")
        elif slow[True] is not None:
            row.fb_cell = "skipped"
            row.notes.append(f"fwd+bwd skipped: > {args.max_call_seconds:g} s per call at L={slow[True]}")
        else:
            progress(f"{scheme_name}/{backend_name} L={length} fwd+bwd")
            reset_peak_memory(args.device)
            if run_cell(row, trainer, scheme, args, train=True):
                slow[True] = length
            row.peak_gib = peak_memory_gib(args.device)
        rows.append(row)
    return rows


def choose_baseline(args, rows: list[Row]) -> tuple[str, str]:
    """--baseline, or the first of BASELINE_ORDER whose fwd+bwd ran at some length (flash-attn
    ALiBi, else FlexAttention ALiBi: what a user would run instead; SDPA no-bias as a last resort,
    e.g. on CPU where flex has no backward)."""
    if isinstance(args.baseline, tuple):
        return args.baseline
    for pair in BASELINE_ORDER:
        if any((r.scheme, r.backend) == pair and r.variant is None and r.fb_tflops is not None for r in rows):
            return pair
    return NO_BIAS


def add_ratios(rows: list[Row], baseline: tuple[str, str]) -> None:
    """Each row's TFLOP/s over the baseline's at the same length, both from this process."""
    base = {r.length: r for r in rows
            if (r.scheme, r.backend) == baseline and r.variant is None and r.length is not None}
    for r in rows:
        b = base.get(r.length)
        if b is None:
            continue
        if r.fwd_tflops is not None and b.fwd_tflops:
            r.fwd_ratio = r.fwd_tflops / b.fwd_tflops
        if r.fb_tflops is not None and b.fb_tflops:
            r.fb_ratio = r.fb_tflops / b.fb_tflops


def fmt(x: float | None, missing: str = "-") -> str:
    if x is None:
        return missing
    return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


def ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


HEADERS = ["scheme", "backend", "L", "B", "fwd ms", "fwd TFLOP/s", "fwd x base", "fwd+bwd ms",
           "fwd+bwd TFLOP/s", "fwd+bwd x base", "peak GiB", "note"]


def backend_label(r: Row) -> str:
    return r.backend + (f" [{r.variant}]" if r.variant else "")


def table(rows: list[Row], baseline: tuple[str, str]) -> str:
    out, previous = [], None
    for r in rows:
        note = "; ".join(r.notes)
        if note and previous == (r.scheme, backend_label(r), note):
            note = "as above"  # a refusal repeats on every length of its case
        else:
            previous = (r.scheme, backend_label(r), note)
        name = r.scheme + (f" ({LABELS[(r.scheme, r.backend)]})" if (r.scheme, r.backend) in LABELS else "")
        if (r.scheme, r.backend) == baseline and r.variant is None:
            name += " **baseline**"
        if r.length is None:
            out.append([name, backend_label(r), "all", "-", "-", "-", "-", "-", "-", "-", "-", note])
            continue
        ms = lambda s: None if s is None else s * 1000.0  # noqa: E731
        out.append([name, backend_label(r), r.length, r.batch, fmt(ms(r.fwd_s), r.fwd_cell), fmt(r.fwd_tflops),
                    ratio(r.fwd_ratio), fmt(ms(r.fb_s), r.fb_cell), fmt(r.fb_tflops), ratio(r.fb_ratio),
                    fmt(r.peak_gib), note])
    return markdown_table(HEADERS, out, right=set(range(2, 11)))


def summary_columns(rows: list[Row]) -> list[tuple[str, str, str | None]]:
    """The summaries' columns: the baselines, then every triton case (issue 22's table)."""
    keys = [(r.scheme, r.backend, r.variant) for r in rows if r.length is not None
            and ((r.scheme, r.backend) in BASELINE_ROWS or r.backend == "triton")]
    keys = list(dict.fromkeys(keys))
    return sorted(keys, key=lambda k: (k[:2] not in BASELINE_ROWS, BASELINE_ROWS.index(k[:2])
                                       if k[:2] in BASELINE_ROWS else 0))


def summary(rows: list[Row], train: bool) -> str | None:
    """TFLOP/s (x baseline) per length, one column per summary_columns case; None without any."""
    columns = summary_columns(rows)
    if not columns:
        return None
    cells = {(r.scheme, r.backend, r.variant, r.length): r for r in rows if r.length is not None}
    lengths = sorted({r.length for r in rows if r.length is not None and (not train or r.fb_cell != "fwd only")})
    header = ["L"] + [LABELS.get(k[:2], f"ours {k[0]}") + (f" [{k[2]}]" if k[2] else "") for k in columns]
    body = []
    for n in lengths:
        line = [n]
        for key in columns:
            r = cells.get((*key, n))
            tflops, rel = (None, None) if r is None else (r.fb_tflops, r.fb_ratio) if train else (r.fwd_tflops, r.fwd_ratio)
            line.append("-" if tflops is None else fmt(tflops) + ("" if rel is None else f" ({rel:.2f}x)"))
        body.append(line)
    return markdown_table(header, body, right=set(range(len(header))))


def report(args, rows: list[Row], baseline: tuple[str, str]) -> str:
    dev = args.device
    lines = ["## Attention kernels (`tools/bench_attention.py`)" + (", CPU" if dev.type == "cpu" else ""), ""]
    if dev.type == "cpu":
        lines += ["**CPU figures: they say nothing about GPU speed** (smoke test of the tool and the backends).", ""]
    lines += environment_lines(dev, "tools/bench_attention.py", args.argv)
    lines += [f"- {args.dtype}, head dim {args.head_dim}, {args.heads} heads, B = max(1, {args.tokens} // L), causal; "
              f"median of {args.reps} reps after {args.warmup} warmup",
              f"- baseline for the `x base` columns: {baseline[0]} on {baseline[1]}, same process, same length"
              + ("" if any((r.scheme, r.backend) == baseline and (r.fwd_s or r.fb_s) for r in rows)
                 else " -- it did not run here (see its row), so those columns are empty"),
              "- TFLOP/s: causal count, fwd 4*B*H*L^2*D/2, fwd+bwd 3.5x that; fwd is an inference forward (no_grad)",
              "- peak GiB: torch.cuda.max_memory_allocated over the fwd+bwd cell (fwd cell for fwd-only lengths), "
              "inputs included" + ("; not measured on CPU ('-')" if dev.type == "cpu" else ""),
              f"- triton bias path: {args.triton_bias} (`[table]` / `[inline]` rows: KERPLE_TRITON_BIAS, "
              "megatron/attention/kernels/bias_table.py); launch configs: "
              + ("autotuned and cached (KERPLE_TRITON_AUTOTUNE=1)" if args.autotune
                 else "the cache or the untuned defaults (megatron/attention/kernels/tuning.py)")]
    for train, title in ((True, "fwd+bwd TFLOP/s (with parameter gradients)"), (False, "fwd TFLOP/s (inference)")):
        text = summary(rows, train)
        if text:
            lines += ["", f"**{title}, x {baseline[0]} on {baseline[1]}:**", "", text]
    lines += ["", "All cells:", "", table(rows, baseline)]
    return "\n".join(lines) + "\n"


def progress(msg: str) -> None:
    print(f"[bench_attention] {msg}", file=sys.stderr, flush=True)


def run(args, on_case=None) -> tuple[list[Row], tuple[str, str], str]:
    """Measure every case; return the rows, the baseline used and the markdown section.
    on_case(section): called after each case with the section of what is measured so far, so a
    run killed at its timeout (a lent GPU's call) still leaves its finished cells behind."""
    if args.autotune:
        os.environ["KERPLE_TRITON_AUTOTUNE"] = "1"
    order = cases(args)
    measured = {}
    for case in sorted(order, key=priority(args)):
        measured[case] = run_case(*case[:2], args, progress, case[2])
        if on_case is not None and len(measured) < len(order):
            on_case(section_of(args, [r for c in order if c in measured for r in measured[c]],
                               f"partial: {len(measured)} of {len(order)} cases measured when this was written"))
    rows = [r for case in order for r in measured[case]]  # the table keeps cases() order
    return rows, *section_of(args, rows, None, with_baseline=True)


def section_of(args, rows: list[Row], partial: str | None, with_baseline: bool = False):
    """The markdown section for these rows (ratios against the baseline chosen among them)."""
    baseline = choose_baseline(args, rows)
    add_ratios(rows, baseline)
    text = report(args, rows, baseline)
    if partial:
        text = mark_partial(text, partial)
    return (baseline, text) if with_baseline else text


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)

    def write(text: str) -> None:
        replace_section(args.out, args.section, text)

    _, _, text = run(args, on_case=write if args.out else None)
    print(text)
    if args.out:
        write(text)
        progress(f"wrote section {args.section!r} of {args.out}")
    return 0
