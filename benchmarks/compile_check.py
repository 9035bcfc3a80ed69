"""Compile the Triton attention kernels for a CUDA target WITHOUT a GPU.

Triton's interpreter (how the tests run the kernels on CPU) executes Python, so it accepts code
that compiled Triton rejects (it let a plain global through, for one). triton.compile with an
explicit GPUTarget runs the real pipeline (TTIR -> TTGIR -> LLVM -> PTX -> cubin with the ptxas
shipped in the triton wheel) on any machine, and reports each variant's shared memory and
register use, so kernels are checked for every constexpr combination the launcher can produce.
"""
from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass, field

# Compiled Triton 3.9 warns once unless this is set; keep its current default (fusion on).
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
if os.environ.get("TRITON_INTERPRET", "0") == "1":
    raise RuntimeError("TRITON_INTERPRET=1 turns the kernels into interpreted functions, which cannot be "
                       "compiled: run the compile check without it (env -u TRITON_INTERPRET ...)")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from megatron.attention.kernels import attention_bwd, attention_fwd  # noqa: E402
from megatron.attention.kernels.tuning import default_config  # noqa: E402
from megatron.config.precision import torch_dtype  # noqa: E402

KERNELS = {
    "fwd": attention_fwd.attention_fwd_kernel,
    "bwd_dkdv": attention_bwd.attention_bwd_dkdv_kernel,
    "bwd_dq": attention_bwd.attention_bwd_dq_kernel,
}
TRITON_DTYPES = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}
# Pointer arguments that hold the activations' dtype; the other pointers are float32 (BUCKET int32).
ACTIVATION_PTRS = {"Q", "K", "V", "DO", "DK", "DV", "DQ"}
FLOAT32_PTRS = {"OUT", "LSE", "DELTA", "PART", "R1", "R2", "R3", "WA", "WP", "LUT", "JAC"}
FLOAT_SCALARS = {"sm_scale"}
# Integer arguments that a typical call passes as multiples of 16 (strides of (B, H, L, D) tensors
# or of fused-QKV views, lengths such as 2048, q0 = k0 = 0, no window = 0, key-block counts).
# The launcher marks such values (and 16-byte aligned pointers) `tt.divisibility=16`, which lets
# the compiler vectorize loads; without the marks K and V are fetched 2 bytes at a time.
ALIGNED_INTS = {"LQ", "LK", "Q0", "K0", "WINDOW", "N_KEY_BLOCKS"}
# Scheme kinds as the launcher's constexprs (megatron/attention/kernels/attention.py _meta).
SCHEMES = {
    "plain": dict(BIAS=0, HAS_R2=False, HAS_R3=False, HAS_WEIGHT=False, HAS_WA=False, HAS_WP=False),
    "kerple_log": dict(BIAS=1, HAS_R2=True, HAS_R3=False, HAS_WEIGHT=False, HAS_WA=False, HAS_WP=False),
    "kerple_log_3para": dict(BIAS=1, HAS_R2=True, HAS_R3=True, HAS_WEIGHT=False, HAS_WA=False, HAS_WP=False),
    "kerple_power_ap_": dict(BIAS=2, HAS_R2=True, HAS_R3=True, HAS_WEIGHT=False, HAS_WA=False, HAS_WP=False),
    "kerple_power_ap_ap": dict(BIAS=2, HAS_R2=True, HAS_R3=True, HAS_WEIGHT=True, HAS_WA=True, HAS_WP=True),
    "alibi": dict(BIAS=2, HAS_R2=True, HAS_R3=False, HAS_WEIGHT=False, HAS_WA=False, HAS_WP=False),
    "rpe": dict(BIAS=3, HAS_R2=False, HAS_R3=False, HAS_WEIGHT=False, HAS_WA=False, HAS_WP=False,
                LUT_GRAD=True),
    "sandwich": dict(BIAS=3, HAS_R2=False, HAS_R3=False, HAS_WEIGHT=False, HAS_WA=False, HAS_WP=False,
                     LUT_GRAD=False),
    # KERPLE-log on the table path (kernels/bias_table.py): a lookup plus one derivative table per
    # parameter (2: r1, r2; 3 with the exponent r3).
    "kerple_log_table": dict(BIAS=3, HAS_R2=False, HAS_R3=False, HAS_WEIGHT=False, HAS_WA=False,
                             HAS_WP=False, LUT_GRAD=False, N_JAC=2),
    "kerple_log_3para_table": dict(BIAS=3, HAS_R2=False, HAS_R3=False, HAS_WEIGHT=False, HAS_WA=False,
                                   HAS_WP=False, LUT_GRAD=False, N_JAC=3),
}


@dataclass
class Compiled:
    kernel: str
    scheme: str
    dtype: str
    head_dim: int
    window: bool
    target: str
    seconds: float
    shared_bytes: int
    registers: int | None
    spills: int | None
    cubin: bytes = field(default=b"", repr=False)  # the sm_<arch> binary, for disassembly (tools/sass_mix.py)


def _signature(fn, dtype: str, constexprs: dict) -> dict:
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in ACTIVATION_PTRS:
            sig[name] = "*" + TRITON_DTYPES[dtype]
        elif name in ("BUCKET", "DOCS"):  # DOCS: packed documents' (start, end) per token, int32
            sig[name] = "*i32"
        elif name == "STARTS":
            sig[name] = "*i64"
        elif name in FLOAT32_PTRS:
            sig[name] = "*fp32"
        elif name in FLOAT_SCALARS:
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def _aligned_attrs(fn, sig: dict) -> dict:
    """The divisibility marks a typical launch gets (triton's specialization: a pointer whose
    address, or an int whose value, is a multiple of 16 is marked 'D'): every pointer, every
    stride (the i32 arguments named s...) and ALIGNED_INTS."""
    marked = {}
    for i, name in enumerate(fn.arg_names):
        kind = sig[name]
        stride = kind == "i32" and name.startswith("s")
        if kind.startswith("*") or stride or (kind == "i32" and name in ALIGNED_INTS):
            marked[(i,)] = [["tt.divisibility", 16]]
    return marked


def default_launch(kernel: str, head_dim: int, dtype: str) -> tuple[tuple[int, int], int, int]:
    """((BLOCK_M, BLOCK_N), num_warps, num_stages) an untuned call of this kernel launches with
    (kernels/tuning.py default_config; dq takes the mirror tile; no stages: Triton's CUDA default, 3)."""
    cfg = default_config("fwd" if kernel == "fwd" else "bwd", head_dim, torch_dtype(dtype))
    blocks = cfg.dq_blocks() if kernel == "bwd_dq" else (cfg.block_m, cfg.block_n)
    return blocks, cfg.num_warps, cfg.num_stages or 3


def compile_variant(kernel: str, scheme: str, dtype: str, head_dim: int, window: bool,
                    arch: int = 90, blocks: tuple[int, int] | None = None, num_warps: int | None = None,
                    num_stages: int | None = None, padded: bool = False, aligned: bool = False,
                    group: int = 1, exact_pv: bool | None = None, documents: bool = False) -> Compiled:
    """Compile one kernel variant for sm_<arch>; raises triton's CompilationError on bad code.
    blocks/num_warps/num_stages left out: the untuned default launch (default_launch), so the
    shared memory reported is what a call asks of the GPU.
    aligned: compile as a typical launch specializes (_aligned_attrs); False compiles the
    most general variant (any pointer alignment, any lengths), which every call can fall back to.
    group: query heads per key/value head (grouped-query attention; the dk/dv kernel then loops
    over a group's query heads, attention_bwd.py).
    documents: packed documents (HAS_DOCS: each token's document bounds, tiles across documents skipped).
    exact_pv: the forward's EXACT_PV (None: on in half precision, the training forward of a scheme
    whose parameters take gradients; a launch without such parameters, or inference, runs it off)."""
    d_blocks, d_warps, d_stages = default_launch(kernel, head_dim, dtype)
    blocks, num_warps = blocks or d_blocks, num_warps or d_warps
    num_stages = num_stages or d_stages
    fn = KERNELS[kernel]
    constexprs = dict({"LUT_GRAD": False, "N_JAC": 0, **SCHEMES[scheme]},
                      D=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
                      BLOCK_M=blocks[0], BLOCK_N=blocks[1], HAS_WINDOW=window,
                      PRECISION="ieee" if dtype == "fp32" else None, UPCAST=False,
                      # half precision: the training path's extra product
                      EXACT_PV=dtype != "fp32" if exact_pv is None else exact_pv,
                      HAS_STARTS=padded, GROUP=group, HAS_DOCS=documents)
    if kernel == "bwd_dkdv":
        constexprs.update(NSLOT=32 if scheme == "rpe" else 8)
    constexprs = {k: v for k, v in constexprs.items() if k in fn.arg_names}
    sig = _signature(fn, dtype, constexprs)
    src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()},
                    attrs=_aligned_attrs(fn, sig) if aligned else None)
    start = time.perf_counter()
    out = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                         options={"num_warps": num_warps, "num_stages": num_stages})
    seconds = time.perf_counter() - start
    meta = out.metadata
    return Compiled(kernel, scheme, dtype, head_dim, window, f"sm_{arch}", seconds, meta.shared,
                    getattr(out, "n_regs", None), getattr(out, "n_spills", None), out.asm["cubin"])


# One variant per kernel with the riskiest features (3 parameters, weight, lookup, window, head
# dim 128, every dtype) and both GPU generations: what the test suite compiles.
# (kernel, scheme, dtype, head dim, window, arch, padded rows, group, documents): each kernel's
# padded-rows branch (HAS_STARTS), its packed-documents branch (HAS_DOCS) and its unpadded key bands
# (kernels/bands.py) compile at least once, and each kernel with grouped-query heads (group > 1: the
# dk/dv kernel's loop over a group's query heads).
QUICK = [
    ("fwd", "kerple_log", "bf16", 64, False, 90, True, 2, False),
    ("bwd_dkdv", "kerple_power_ap_ap", "fp16", 128, True, 90, True, 4, False),
    ("bwd_dq", "rpe", "fp32", 64, True, 90, True, 2, False),
    ("bwd_dkdv", "kerple_log_3para", "bf16", 64, False, 80, False, 1, True),
    ("bwd_dkdv", "kerple_log_3para_table", "bf16", 64, True, 90, False, 8, False),
    ("fwd", "kerple_log_3para_table", "bf16", 64, True, 90, False, 1, True),  # the three key bands, windowed
    ("bwd_dq", "kerple_log_3para_table", "fp16", 64, True, 80, False, 1, True),
    # fp32 at head dim 128 on the table path: the largest forward tiles (an H200 refused 3 stages)
    ("fwd", "rpe", "fp32", 128, True, 90, False, 1, False),
]


def all_variants(schemes=tuple(SCHEMES), dtypes=("bf16", "fp16", "fp32"), head_dims=(64, 128),
                 windows=(False, True), kernels=tuple(KERNELS), padded=(False,)):
    return itertools.product(kernels, schemes, dtypes, head_dims, windows, padded)
