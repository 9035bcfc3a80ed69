"""Peak memory of one attention call with grouped-query k/v: repeated to every query head first
(what megatron/model/attention.py did before issue 42 part 3) against handed to the backend with
their H_kv heads (what it does now), as one markdown table.

    python tools/bench_gqa_memory.py                                           # CPU, SDPA, a few shapes
    python tools/bench_gqa_memory.py --out docs/benchmarks.md --section gqa-memory
    python tools/bench_gqa_memory.py --device cuda --backends sdpa triton flex --lengths 4096 16384

Each cell is one call measured by benchmarks.timing.call_peak_bytes (CPU: every
allocation through PyTorch's CPU allocator during the call, from the profiler; CUDA: the
allocator's peak), above what was allocated before it: the inputs q, k, v are not counted, the
repeated k, v, the output, the backend's scratch and (fwd+bwd) the saved tensors and every
gradient are. "fwd" runs under torch.no_grad (evaluation); "fwd+bwd" backpropagates into q, k, v
and the scheme's parameters (training). The repeat's own k+v is 2 * B * (H - H_kv) * L * D
elements; the table says how much of it each route saves and what the rest of the call costs.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import torch

from benchmarks.cli import check_names, check_positive, pick_device, set_threads
from benchmarks.report import SECTION_NAME, environment_lines, markdown_table, replace_section
from benchmarks.timing import call_peak_bytes, error_cell, release_memory
from megatron.attention import backend_names, resolve_backend
from megatron.attention.base import repeat_kv
from megatron.cli_args import ArgumentParser
from megatron.config.precision import DTYPE_NAMES, torch_dtype
from megatron.positional.base import PositionalSpec
from megatron.positional.registry import build_scheme, scheme_names

# (H, H_kv): Llama-2-70B's and Mistral-7B's 8:1 grouping at 8 and 32 heads, a 4:1 one, and MQA.
HEADS = ["8:2", "8:1", "32:8"]
MODES = ("fwd", "fwd+bwd")


@dataclass
class Row:
    scheme: str
    backend: str
    mode: str
    length: int
    heads: int
    kv_heads: int
    repeated: int | str | None = None  # peak bytes, or an error cell
    grouped: int | str | None = None


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, auto")
    p.add_argument("--backends", nargs="+", default=["sdpa"], help="attention backends (default sdpa)")
    p.add_argument("--schemes", nargs="+", default=["kerple_log", "rotary"],
                   help="positional schemes (default: kerple_log, a score bias; rotary, none)")
    p.add_argument("--lengths", nargs="+", type=int, default=[1024, 2048, 4096], help="sequence lengths")
    p.add_argument("--train-lengths", nargs="+", type=int, default=[1024, 2048],
                   help="lengths measured fwd+bwd too (a dense CPU training mask is H x L x L)")
    p.add_argument("--heads", nargs="+", default=HEADS, metavar="H:H_KV", help=f"head layouts (default {HEADS})")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", default="fp32", choices=DTYPE_NAMES)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: a shared machine)")
    p.add_argument("--out", default=None, help="markdown file whose section to rewrite (e.g. docs/benchmarks.md)")
    p.add_argument("--section", default="gqa-memory", help="section name in --out (default gqa-memory)")
    p.add_argument("--note", default=None, help="a line for the section: what else ran on the machine")
    args = p.parse_args(argv)
    check_names(p, args.backends, backend_names(), "backend")
    check_names(p, args.schemes, scheme_names(), "scheme")
    check_positive(p, lengths=args.lengths, train_lengths=args.train_lengths, head_dim=args.head_dim,
                   batch=args.batch)
    args.layouts = []
    for item in args.heads:
        try:
            h, g = (int(x) for x in item.split(":"))
        except ValueError:
            p.error(f"--heads {item!r}: write H:H_KV, e.g. 8:2")
        if h < 1 or g < 1 or h % g:
            p.error(f"--heads {item!r}: H_KV must divide H (both >= 1)")
        args.layouts.append((h, g))
    if not SECTION_NAME.match(args.section):
        p.error(f"--section {args.section!r}: use lower-case letters, digits, '_' or '-'")
    set_threads(p, args.threads)
    args.device = pick_device(p, args.device)
    return args


def attention_call(backend, scheme, q, k, v, pos, train: bool, repeat: bool):
    """One call as the model makes it: rotate, (repeat,) attend; with train, backpropagate too."""
    group = q.shape[1] // k.shape[1]

    def call():
        qr, kr = scheme.rotate_qk(q, k, pos, pos)
        kr, vr = (repeat_kv(kr, group), repeat_kv(v, group)) if repeat else (kr, v)
        out = backend.forward(qr, kr, vr, scheme, pos, pos)
        if train:
            out.backward(torch.ones_like(out))
    return call


def measure(args, scheme_name: str, backend_name: str, mode: str, length: int, heads: int, kv_heads: int) -> Row:
    row = Row(scheme_name, backend_name, mode, length, heads, kv_heads)
    train = mode == "fwd+bwd"
    spec = PositionalSpec(num_heads=heads, head_dim=args.head_dim, hidden_size=heads * args.head_dim,
                          max_position_embeddings=length)
    dtype = torch_dtype(args.dtype)
    torch.manual_seed(0)
    scheme = build_scheme(scheme_name, spec).to(args.device)
    try:
        backend = resolve_backend(backend_name, scheme, args.device, dtype, train)
    except ValueError as e:
        row.repeated = row.grouped = error_cell(e)
        return row
    shape = (args.batch, heads, length, args.head_dim)
    q = torch.randn(shape, device=args.device, dtype=dtype, requires_grad=train)
    k, v = (torch.randn(args.batch, kv_heads, length, args.head_dim, device=args.device, dtype=dtype,
                        requires_grad=train) for _ in range(2))
    pos = torch.arange(length, device=args.device)
    for attr, repeat in (("repeated", True), ("grouped", False)):
        for x in (q, k, v, *scheme.parameters()):
            x.grad = None  # gradients of the previous call are allocated before this one
        release_memory(args.device)
        try:
            with torch.set_grad_enabled(train):
                setattr(row, attr, call_peak_bytes(attention_call(backend, scheme, q, k, v, pos, train, repeat),
                                                   args.device))
        except Exception as e:  # an OOM or a backend refusing the shape: the cell says so
            setattr(row, attr, error_cell(e))
    return row


def mib(x) -> str:
    return f"{x / 2**20:,.1f}" if isinstance(x, int) else str(x)


def table(args, rows: list[Row]) -> str:
    elem = torch.tensor([], dtype=torch_dtype(args.dtype)).element_size()
    headers = ["scheme", "backend", "mode", "L", "H", "H_kv", "repeat's k+v MiB", "peak with repeat MiB",
               "peak without MiB", "saved MiB", "without / with"]
    body = []
    for r in rows:
        copy = 2 * args.batch * (r.heads - r.kv_heads) * r.length * args.head_dim * elem
        both = isinstance(r.repeated, int) and isinstance(r.grouped, int)
        body.append([r.scheme, r.backend, r.mode, r.length, r.heads, r.kv_heads, mib(copy), mib(r.repeated),
                     mib(r.grouped), mib(r.repeated - r.grouped) if both else "-",
                     f"{r.grouped / r.repeated:.2f}" if both and r.repeated else "-"])
    return markdown_table(headers, body, right=set(range(3, len(headers))))


def report(args, rows: list[Row], argv: list[str]) -> str:
    lines = ["## Grouped-query attention: peak memory of one attention call (`tools/bench_gqa_memory.py`)", "",
             *environment_lines(args.device, "tools/bench_gqa_memory.py", argv),
             f"- batch {args.batch}, head dim {args.head_dim}, {args.dtype}"]
    if args.note:
        lines.append(f"- {args.note}")
    lines += ["", table(args, rows), "",
              "- peak: benchmarks.timing.call_peak_bytes over the call (inputs excluded; the "
              "repeated k, v, output, scratch, saved tensors and gradients included); "
              "fwd under no_grad, fwd+bwd into q, k, v and the scheme's parameters",
              "- repeat's k+v: 2 x B x (H - H_kv) x L x D elements, the copy the old model made per layer"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    rows = []
    for scheme_name in args.schemes:
        for backend_name in args.backends:
            for mode in MODES:
                for length in args.lengths if mode == "fwd" else args.train_lengths:
                    for heads, kv_heads in args.layouts:
                        rows.append(measure(args, scheme_name, backend_name, mode, length, heads, kv_heads))
                        print(f"[bench_gqa_memory] {scheme_name}/{backend_name} {mode} L={length} "
                              f"H={heads} H_kv={kv_heads}: with repeat {mib(rows[-1].repeated)} MiB, "
                              f"without {mib(rows[-1].grouped)} MiB", file=sys.stderr, flush=True)
    text = report(args, rows, argv)
    print(text)
    if args.out:
        replace_section(args.out, args.section, text)
    return 0
