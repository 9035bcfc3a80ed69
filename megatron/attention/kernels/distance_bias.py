"""The score bias and weight of a DistanceKernel, evaluated inside Triton kernels.

Shared by the forward and both backward kernels so all three see bit-identical values. Every
function takes the distance block `d` (float32, >= 0; masked entries hold 0 so everything stays
finite) and the current head's parameters as scalars. Kinds (megatron/positional/distance_kernel.py):
BIAS = 0 none, 1 log, 2 power, 3 lookup (a T5 table, or a tabulated fixed function: Sandwich)."""
import triton
import triton.language as tl

from megatron.attention.kernels.fma_log2 import log2_ge1

BIAS_CODES = {"none": 0, "log": 1, "power": 2, "lookup": 3}
# The kernels' softmax works in log2 units (exp2): scores and biases are scaled by LOG2E.
LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def pow_and_log(d, p, HAS_P: tl.constexpr):
    """(d**p, log d) with d**p = 0 and log d = 0 at d = 0; without p: (d, log d). d is an integer
    distance, so d > 0 means d >= 1: log2 on the FMA pipe (kernels/fma_log2.py), and d**p as one
    exp2 (the hardware's own), not libdevice's log and exp."""
    positive = d > 0
    log2_d = log2_ge1(tl.where(positive, d, 1.0))
    if HAS_P:
        x = tl.where(positive, tl.exp2(p * log2_d), 0.0)
    else:
        x = d
    return x, log2_d * LN2


@triton.jit
def score_weight(d, w_a, w_p, HAS_WA: tl.constexpr, HAS_WP: tl.constexpr):
    """exp(-w_a * d**w_p) (missing parameters are 1)."""
    y, _ = pow_and_log(d, w_p, HAS_WP)
    if HAS_WA:
        y = w_a * y
    return tl.exp(-y)


@triton.jit
def score_bias_log2(d, d_index, r1, r2, r3, lut_row, BIAS: tl.constexpr, HAS_R2: tl.constexpr,
                    HAS_R3: tl.constexpr, MAXD):
    """The additive bias block in the softmax's log2 units (the bias times LOG2E). lut_row points
    at this head's lookup values (lookup kind only); d_index is the integer distance block used to
    index it. The log kind needs no LOG2E at all: -r1 * ln(z) * LOG2E = -r1 * log2(z), with
    z = 1 + r2 x >= 1 (r2 >= 1e-2, x >= 0), so log2 runs on the FMA pipe (kernels/fma_log2.py)."""
    if BIAS == 3:
        return tl.load(lut_row + tl.minimum(d_index, MAXD)) * LOG2E
    x, _ = pow_and_log(d, r3, HAS_R3)
    if BIAS == 1:
        return -r1 * log2_ge1(1.0 + r2 * x)
    slope = LOG2E  # a scalar: the per-score work stays one multiply
    if HAS_R2:
        slope = r2 * LOG2E
    return -slope * x


# Far tiles of the KERPLE-log bias (kernels/bands.py far_split): a tile whose distances d = D + delta
# (D its centre, |delta| <= R = (BLOCK_M + BLOCK_N - 2) / 2) all satisfy r2 |delta| <= FAR_U (1 + r2 D)
# takes log2(1 + r2 d) = log2(1 + r2 D) + log2(1 + u), u = r2 delta / (1 + r2 D), |u| <= FAR_U, from
# the degree-5 Taylor series of log2(1 + u): 5 FMAs a score instead of log2_ge1's bit work and 8
# FMAs. Truncation error <= FAR_U^6 / (6 ln 2 (1 - FAR_U)) = 1.1e-6 absolute, next to log2_ge1's
# 3.7e-7 relative on a log2 that is >= 2 there. The condition holds once D >= R / FAR_U - 1 / r2
# (FAR_SPAN R), whatever r2: at long lengths nearly every tile is far.
FAR_U = tl.constexpr(0.125)
FAR_SPAN = tl.constexpr(8)  # 1 / FAR_U


@triton.jit
def far_distance(r2, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The smallest integer tile-centre distance D whose tile is far (see FAR_U) for this head."""
    span = FAR_SPAN * ((BLOCK_M + BLOCK_N - 2) // 2)
    return tl.math.ceil(span - 1.0 / r2).to(tl.int32)


@triton.jit
def far_coefficients(center, r2):
    """(a1, ..., a5, log2(1 + r2 D)) of the series around a far tile's centre distance D (an int):
    log2(1 + r2 (D + delta)) = l0 + a1 delta + ... + a5 delta^5, a_k = (-1)^(k+1) c^k / (k ln 2),
    c = r2 / (1 + r2 D). Per tile (scalars), not per score."""
    z = 1.0 + r2 * center.to(tl.float32)
    c = r2 / z
    a1 = c * LOG2E
    a2 = a1 * c * -0.5
    a3 = a1 * (c * c) * (1.0 / 3.0)
    a4 = a2 * (c * c) * 0.5
    a5 = a1 * ((c * c) * (c * c)) * 0.2
    return a1, a2, a3, a4, a5, log2_ge1(z)


@triton.jit
def far_bias_log2(s, delta, a1, a2, a3, a4, a5, l0, r1):
    """s - r1 * log2(1 + r2 d) on a far tile, delta = d - D (far_coefficients): Horner with -r1
    folded into the (per-tile) coefficients, 5 FMAs a score with the add to s. (The name far_h
    marks these lines for tools/sass_mix.py, which tells the far tiles' loop by them.)"""
    m = -r1
    far_h = (m * a5) * delta + m * a4
    far_h = far_h * delta + m * a3
    far_h = far_h * delta + m * a2
    far_h = far_h * delta + m * a1
    return (s + m * l0) + far_h * delta


@triton.jit
def far_log2(delta, a1, a2, a3, a4, a5, l0):
    """log2(1 + r2 d) on a far tile (the gradients' log): far_bias_log2 of s = -0, r1 = -1."""
    return far_bias_log2(-0.0, delta, a1, a2, a3, a4, a5, l0, -1.0)


@triton.jit
def mm(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr, acc=None):
    """tl.dot with an fp32 accumulator (acc + a @ b when acc is given). UPCAST is set only under
    TRITON_INTERPRET=1 with bfloat16 inputs: Triton 3.9's interpreter multiplies bf16 operands
    wrongly (~1e10 errors on a plain 16x16 product), so there the operands, already rounded to
    bf16 (see `cast`), are multiplied in fp32."""
    if UPCAST:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        out = tl.dot(a, b, acc, input_precision=PRECISION)
    return out


@triton.jit
def cast(x, dtype: tl.constexpr, UPCAST: tl.constexpr):
    """x.to(dtype) with round-to-nearest-even. Under UPCAST (interpreter + bf16) the rounding is
    done by hand and the result stays fp32: the interpreter converts fp32 -> bf16 by truncation
    (checked: bit-identical to masking the low 16 bits), which biases every rounded value toward
    zero and doubled the bf16 gradient error in tests; compiled Triton rounds to nearest."""
    if UPCAST:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    return x.to(dtype)


@triton.jit
def load_head_params(R1, R2, R3, WA, WP, h, BIAS: tl.constexpr, HAS_R2: tl.constexpr, HAS_R3: tl.constexpr,
                     HAS_WA: tl.constexpr, HAS_WP: tl.constexpr):
    """This head's (r1, r2, r3, w_a, w_p); parameters the scheme lacks are 0.0 and never read."""
    r1 = 0.0
    r2 = 0.0
    r3 = 0.0
    w_a = 0.0
    w_p = 0.0
    if BIAS == 1:
        r1 = tl.load(R1 + h)
    if HAS_R2:
        r2 = tl.load(R2 + h)
    if HAS_R3:
        r3 = tl.load(R3 + h)
    if HAS_WA:
        w_a = tl.load(WA + h)
    if HAS_WP:
        w_p = tl.load(WP + h)
    return r1, r2, r3, w_a, w_p
