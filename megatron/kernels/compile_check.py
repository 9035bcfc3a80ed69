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
from dataclasses import dataclass

# Compiled Triton 3.9 warns once unless this is set; keep its current default (fusion on).
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
if os.environ.get("TRITON_INTERPRET", "0") == "1":
    raise RuntimeError("TRITON_INTERPRET=1 turns the kernels into interpreted functions, which cannot be "
                       "compiled: run the compile check without it (env -u TRITON_INTERPRET ...)")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from megatron.kernels import attention_bwd, attention_fwd  # noqa: E402

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
# Scheme kinds as the launcher's constexprs (megatron/kernels/attention.py _meta).
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
    # kerple_log_3para on the table path (kernels/bias_table.py): a lookup plus 3 derivative tables.
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


def _signature(fn, dtype: str, constexprs: dict) -> dict:
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in ACTIVATION_PTRS:
            sig[name] = "*" + TRITON_DTYPES[dtype]
        elif name == "BUCKET":
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


def compile_variant(kernel: str, scheme: str, dtype: str, head_dim: int, window: bool,
                    arch: int = 90, blocks: tuple[int, int] = (64, 64), num_warps: int = 4,
                    num_stages: int = 2, padded: bool = False) -> Compiled:
    """Compile one kernel variant for sm_<arch>; raises triton's CompilationError on bad code."""
    fn = KERNELS[kernel]
    constexprs = dict({"LUT_GRAD": False, "N_JAC": 0, **SCHEMES[scheme]},
                      D=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
                      BLOCK_M=blocks[0], BLOCK_N=blocks[1], HAS_WINDOW=window,
                      PRECISION="ieee" if dtype == "fp32" else None, UPCAST=False,
                      EXACT_PV=dtype != "fp32",  # half precision: the training path's extra product
                      HAS_STARTS=padded)
    if kernel == "bwd_dkdv":
        constexprs.update(NSLOT=32 if scheme == "rpe" else 8)
    constexprs = {k: v for k, v in constexprs.items() if k in fn.arg_names}
    src = ASTSource(fn, _signature(fn, dtype, constexprs),
                    constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()})
    start = time.perf_counter()
    out = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                         options={"num_warps": num_warps, "num_stages": num_stages})
    seconds = time.perf_counter() - start
    meta = out.metadata
    return Compiled(kernel, scheme, dtype, head_dim, window, f"sm_{arch}", seconds, meta.shared,
                    getattr(out, "n_regs", None), getattr(out, "n_spills", None))


# One variant per kernel with the riskiest features (3 parameters, weight, lookup, window, head
# dim 128, every dtype) and both GPU generations: what the test suite compiles.
# (kernel, scheme, dtype, head dim, window, arch, padded rows): each kernel's padded-rows branch
# (HAS_STARTS) and its unpadded key bands (kernels/bands.py) compile at least once.
QUICK = [
    ("fwd", "kerple_log", "bf16", 64, False, 90, True),
    ("bwd_dkdv", "kerple_power_ap_ap", "fp16", 128, True, 90, True),
    ("bwd_dq", "rpe", "fp32", 64, True, 90, True),
    ("bwd_dkdv", "kerple_log_3para", "bf16", 64, False, 80, False),
    ("bwd_dkdv", "kerple_log_3para_table", "bf16", 64, True, 90, False),
    ("fwd", "kerple_log_3para_table", "bf16", 64, True, 90, False),  # the three key bands, windowed
    ("bwd_dq", "kerple_log_3para_table", "fp16", 64, True, 80, False),
]


def all_variants(schemes=tuple(SCHEMES), dtypes=("bf16", "fp16", "fp32"), head_dims=(64, 128),
                 windows=(False, True), kernels=tuple(KERNELS), padded=(False,)):
    return itertools.product(kernels, schemes, dtypes, head_dims, windows, padded)
