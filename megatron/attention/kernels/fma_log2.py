"""log2 for z >= 1 on the FMA pipe: the exponent from the float's bits, the mantissa's log2 from
a degree-7 polynomial (7 FFMA and one for the sum), with no special cases.

Why not tl.log / tl.log2: compiled Triton calls libdevice's logf/log2f, which spends ~14
instructions a score (a polynomial of its own plus checks for 0, negatives, infinities and
subnormals); the KERPLE-log bias evaluates it once per score, which was most of the inner loop's
extra work over ALiBi (tools/sass_mix.py). Every argument here is 1 + r2 * x with r2 >= 1e-2
and x >= 0 (or a distance >= 1), so it is finite and normal and none of those checks can fire.

Range reduction: z = 2^e * m with m in [1, 2) read straight from the bits (a shift and a logical
op for e, one logical op for m), f = m - 1 in [0, 1) is exact; log2(z) = e + f * P(f). P is a weighted
least-squares (Lawson) fit of log2(1 + f) / f on [0, 1): evaluated in fp32 over z in [1, 2^24]
the result is within 3.7e-7 relative (1.3e-6 absolute at log2 z ~ 24, where fp32's own rounding
of the result is 1e-6), far below bf16's 4e-3; tests/unit/test_fma_log2.py checks it.
The same code runs in Triton's interpreter, so the CPU tests check the GPU's arithmetic."""
import triton
import triton.language as tl

# P(f) = C0 + C1 f + ... + C7 f^7 (constexpr globals: compiled Triton refuses plain globals)
C0 = tl.constexpr(1.4426947832107544)
C1 = tl.constexpr(-0.7213143110275269)
C2 = tl.constexpr(0.4801313281059265)
C3 = tl.constexpr(-0.3538002073764801)
C4 = tl.constexpr(0.2571668028831482)
C5 = tl.constexpr(-0.1570475548505783)
C6 = tl.constexpr(0.06484028697013855)
C7 = tl.constexpr(-0.012671387754380703)
MANTISSA = tl.constexpr(0x007FFFFF)
ONE_BITS = tl.constexpr(0x3F800000)  # the bits of 1.0f
TWO23_BITS = tl.constexpr(0x4B000000)  # the bits of 2^23: OR-ing an integer n < 2^23 in gives 2^23 + n
TWO23_PLUS_BIAS = tl.constexpr(8388735.0)  # 2^23 + 127


@triton.jit
def small_int_to_float(n):
    """float(n) for int32 0 <= n < 2^23 without I2F (a conversion: a quarter-rate pipe on sm_90):
    n OR-ed into the mantissa of 2^23 reads as 2^23 + n; subtracting 2^23 is exact."""
    return (n | TWO23_BITS).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def log2_ge1(z):
    """log2(z) for fp32 z >= 1 (finite): three integer ops, two adds, 8 FMAs, no conversion.
    The exponent becomes a float without I2F (a conversion: a quarter-rate pipe on sm_90, one per
    score): the biased exponent n = bits >> 23 OR-ed into the mantissa of 2^23 reads as 2^23 + n,
    and subtracting 2^23 + 127 (exact: both are integers below 2^24) leaves e = n - 127."""
    bits = z.to(tl.int32, bitcast=True)
    e = ((bits >> 23) | TWO23_BITS).to(tl.float32, bitcast=True) - TWO23_PLUS_BIAS  # z >= 1: sign bit 0
    f = ((bits & MANTISSA) | ONE_BITS).to(tl.float32, bitcast=True) - 1.0  # m - 1, m in [1, 2)
    p = C7 * f + C6
    p = p * f + C5
    p = p * f + C4
    p = p * f + C3
    p = p * f + C2
    p = p * f + C1
    p = p * f + C0
    return f * p + e
