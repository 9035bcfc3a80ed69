"""Forward Triton kernel: causal (optionally windowed) softmax attention with a positional score
bias/weight computed on the fly: FlashAttention-2 style online softmax, O(L) memory.

One program per (block of BLOCK_M queries, batch*head). It walks only the key blocks the causal
window can reach and stores the output and the row log-sum-exp (for the backward kernels).
Grouped-query attention (GROUP query heads per key/value head, H = GROUP * H_kv): query head h
reads key/value head h // GROUP in place.

Positions are consecutive: query row i sits at Q0 + i and key column j at K0 + j (kv-cache rows
have Q0 > K0), so the distance is d = Q0 + i - K0 - j. Allowed: 0 <= d (< WINDOW when windowed).
Masked scores are a large finite negative number, not -inf: a row whose first key blocks are all
masked gets exp(0) garbage, which the first allowed key wipes out exactly (its rescale factor is
exp(-1e30 - m) = 0). Every real row has its diagonal, so every stored row saw an allowed key.
Padded batches (HAS_STARTS): key K0 + j of batch row b is hidden when it precedes STARTS[b], except
from the query at its own position (megatron/attention/mask.py, the one rule).
Packed documents (HAS_DOCS, Q0 = K0: queries and keys the same tokens): DOCS[b, 0, t] is where
token t's document begins, DOCS[b, 1, t] one past its end; key j is hidden from query i when
j < DOCS[b, 0, i], and key blocks wholly before the block's first document are never visited
(kernels/bands.py document_keys).
EXACT_PV (half-precision inputs whose positional parameters need gradients) multiplies P by V in
two halves so O is P @ V to ~2^-17 (the backward's delta relies on it).
The online softmax runs in log2 units (exp2, log2 e folded into the scale); LSE is stored in
natural units, as the backward kernels read it."""
import triton
import triton.language as tl

from megatron.attention.kernels.bands import document_keys, key_walk, walk_part
from megatron.attention.kernels.distance_bias import (
    LN2,
    LOG2E,
    cast,
    far_bias_log2,
    far_coefficients,
    far_distance,
    load_head_params,
    mm,
    score_bias_log2,
    score_weight,
)
from megatron.attention.kernels.fma_log2 import small_int_to_float

NEG = tl.constexpr(-1.0e30)  # a constexpr global: compiled Triton refuses plain globals
RESCALE_SLACK = tl.constexpr(8.0)  # log2 units: P <= 256 between rescales (fp32 acc, bf16 P: no range issue)

@triton.jit
def _rescale(acc, l_i, m_i, m_new):
    """The online softmax's move of the running max to m_new: acc and l_i rescaled to it."""
    alpha = tl.exp2(m_i - m_new)
    return acc * alpha[:, None], l_i * alpha, m_new


@triton.jit
def _fwd_band(acc, m_i, l_i, q, k_base, v_base, skn, svn, lo, hi, q_pos, q_first, offs_n, offs_d, d_ok, LK, K0,
              WINDOW, start_b, doc_q, qk_scale, r1, r2, r3, w_a, w_p, lut_row, MAXD,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FAR: tl.constexpr,
              BIAS: tl.constexpr, HAS_R2: tl.constexpr, HAS_R3: tl.constexpr,
              HAS_WEIGHT: tl.constexpr, HAS_WA: tl.constexpr, HAS_WP: tl.constexpr,
              HAS_WINDOW: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
              EXACT_PV: tl.constexpr, HAS_STARTS: tl.constexpr, HAS_DOCS: tl.constexpr, MASKED: tl.constexpr):
    """The online softmax over the key blocks starting at lo, lo + BLOCK_N, ... < hi. MASKED False:
    the caller guarantees every (query, key) pair of these tiles is allowed (keys in range, before
    the block's first query, inside the window, no padding), so no mask and no clamp is computed.
    FAR (unmasked KERPLE-log tiles far from the diagonal, kernels/distance_bias.py FAR_U): the log
    of the bias comes from a series around the tile's centre distance, in delta = d - centre, which
    is i - j - (BLOCK_M - BLOCK_N) / 2 on every such tile."""
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        if MASKED:
            col_ok = cols < LK
            kv_mask = col_ok[:, None] & d_ok[None, :]
        else:
            kv_mask = d_ok[None, :]
        k = tl.load(k_base + cols[:, None] * skn + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_base + cols[:, None] * svn + offs_d[None, :], mask=kv_mask, other=0.0)
        s = mm(q, tl.trans(k), PRECISION, UPCAST) * qk_scale  # (BM, BN) fp32, log2 units

        # The distance: an integer difference, made a float without I2F (a conversion per score
        # is a quarter-rate pipe on sm_90; fma_log2.small_int_to_float). Exact below 2^23.
        # An unmasked tile of a computed bias needs no integer distance at all: the difference
        # of a per-row and a per-column float is one FADD a score (exact: integers below 2^23;
        # sm_90 SASS: alibi 679 -> 617 loop instructions, KERPLE-log near tiles 1159 -> 1099).
        # Not with a learned exponent: from integer distances the compiler evaluates its exp2/log2
        # once per distinct distance of a thread (kerple_power_ap_ 938 against 1211 from floats).
        FLOAT_D: tl.constexpr = not MASKED and BIAS != 3 and not FAR and not HAS_R3
        d_index = (q_pos - (K0 + start_n))[:, None] - offs_n[None, :]
        if FAR:  # per tile: the series around its centre distance
            center = q_first - (K0 + start_n) + (BLOCK_M - BLOCK_N) // 2
            a1, a2, a3, a4, a5, l0 = far_coefficients(center, r2)
        if MASKED:
            allowed = (d_index >= 0) & col_ok[None, :]
            if HAS_WINDOW:
                allowed = allowed & (d_index < WINDOW)
            if HAS_STARTS:
                allowed = allowed & (((K0 + cols)[None, :] >= start_b) | (d_index == 0))
            if HAS_DOCS:  # the key lies in the query's document (megatron/attention/mask.py)
                allowed = allowed & (cols[None, :] >= doc_q[:, None])
            d_index = tl.maximum(d_index, 0)
        if FAR:  # -r1 log2(1 + r2 d), the log2 by its series (the kernel's bias is in log2 units)
            delta = ((tl.arange(0, BLOCK_M) - (BLOCK_M - BLOCK_N) // 2).to(tl.float32)[:, None]
                     - offs_n.to(tl.float32)[None, :])  # d - centre: the same on every tile
            s = far_bias_log2(s, delta, a1, a2, a3, a4, a5, l0, r1)
        else:
            if FLOAT_D:
                d = (q_pos - (K0 + start_n)).to(tl.float32)[:, None] - offs_n.to(tl.float32)[None, :]
            else:
                d = small_int_to_float(d_index)
            if HAS_WEIGHT:
                s = s * score_weight(d, w_a, w_p, HAS_WA, HAS_WP)
            if BIAS != 0:  # already in log2 units
                s = s + score_bias_log2(d, d_index, r1, r2, r3, lut_row, BIAS, HAS_R2, HAS_R3, MAXD)
        if MASKED:
            s = tl.where(allowed, s, NEG)

        # Lazy rescaling: the running max m_i moves only when some row's max grew by more than
        # RESCALE_SLACK (log2 units) in this tile; otherwise P = exp2(S - m_i) <= 2^RESCALE_SLACK
        # and acc, l_i keep their scale. acc * alpha is a multiply per accumulator element
        # (BLOCK_D / BLOCK_N per score: 2 at head dim 128) that most tiles then skip: past the
        # first (diagonal) tiles the max rarely grows, and less still under a decaying bias.
        # O = acc / l and LSE = m + log2 l use the same m, so they are exact whichever m it is.
        # Not with a learned exponent (HAS_R3): there the branch cost more than it saves, the
        # compiler then evaluated the exp2/log2 bias for more of a thread's distances (sm_90 SASS,
        # tools/sass_mix.py: kerple_power_ap_ 938 -> 1286 loop instructions).
        m_new = tl.maximum(m_i, tl.max(s, 1))
        if HAS_R3:
            acc, l_i, m_i = _rescale(acc, l_i, m_i, m_new)
        elif tl.max(m_new - m_i, 0) > RESCALE_SLACK:
            acc, l_i, m_i = _rescale(acc, l_i, m_i, m_new)
        p = tl.exp2(s - m_i[:, None])
        l_i = l_i + tl.sum(p, 1)
        p_hi = cast(p, v.dtype, UPCAST)
        acc = mm(p_hi, v, PRECISION, UPCAST, acc)
        if EXACT_PV:  # P = hi + lo, both in V's dtype (kernels/attention.py says why)
            acc = mm(cast(p - p_hi.to(tl.float32), v.dtype, UPCAST), v, PRECISION, UPCAST, acc)
    return acc, m_i, l_i


@triton.jit
def attention_fwd_kernel(
    Q, K, V, OUT, LSE,
    R1, R2, R3, WA, WP, LUT, STARTS, DOCS,
    sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sob, soh, som,
    H, LQ, LK, Q0, K0, WINDOW, sm_scale,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BIAS: tl.constexpr, HAS_R2: tl.constexpr, HAS_R3: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, HAS_WA: tl.constexpr, HAS_WP: tl.constexpr,
    HAS_WINDOW: tl.constexpr, MAXD, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    EXACT_PV: tl.constexpr, HAS_STARTS: tl.constexpr, HAS_DOCS: tl.constexpr, GROUP: tl.constexpr,
):
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)  # int64: b * stride_b passes 2^31 at long contexts
    h = (bh % H).to(tl.int64)
    h_kv = h // GROUP  # grouped-query attention: the key/value head this query head reads
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)  # query rows
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    row_ok = offs_m < LQ

    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # (BM, BD)
    r1, r2, r3, w_a, w_p = load_head_params(R1, R2, R3, WA, WP, h, BIAS, HAS_R2, HAS_R3, HAS_WA, HAS_WP)
    lut_row = LUT + h * (MAXD + 1)

    q_pos = Q0 + offs_m
    # Scores are kept in log2 units (S * log2 e) so the softmax uses exp2, which is what the GPU
    # computes natively: tl.exp would multiply by log2 e once per score again. The weight is a
    # factor (unit-free); the bias comes in log2 units (distance_bias.score_bias_log2).
    qk_scale = sm_scale * LOG2E
    start_b = 0
    if HAS_STARTS:
        start_b = tl.load(STARTS + b)
    lo, hi, full_lo, full_hi = key_walk(start_m, Q0, K0, LQ, LK, WINDOW, BLOCK_M, BLOCK_N, HAS_WINDOW,
                                        HAS_STARTS, False)  # kernels/bands.py
    doc_q = offs_m  # (unused without documents)
    if HAS_DOCS:
        doc_row = DOCS + b * 2 * LQ
        doc_q = tl.load(doc_row + offs_m, mask=row_ok, other=0)  # each query's document start
        last = tl.minimum(start_m * BLOCK_M + BLOCK_M, LQ) - 1
        lo, full_lo = document_keys(lo, full_lo, tl.load(doc_row + start_m * BLOCK_M), tl.load(doc_row + last),
                                    BLOCK_N)
    m_i = tl.full([BLOCK_M], NEG, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    k_base = K + b * skb + h_kv * skh
    v_base = V + b * svb + h_kv * svh
    q_first = Q0 + start_m * BLOCK_M
    # KERPLE-log's far tiles (kernels/distance_bias.py FAR_U), those whose centre distance
    # q_first - (K0 + key start) + (BLOCK_M - BLOCK_N) / 2 reaches far_distance: the unmasked band's first
    # key blocks, walked by a loop of their own.
    FAR: tl.constexpr = BIAS == 1 and HAS_R2 and not HAS_R3 and not HAS_WEIGHT
    far_end = hi
    if FAR:
        far_end = q_first - K0 + (BLOCK_M - BLOCK_N) // 2 - far_distance(r2, BLOCK_M, BLOCK_N) + 1
    for part in tl.static_range(4):  # masked, far unmasked, near unmasked, masked
        if part != 2 or FAR:  # without far tiles part 1 is the whole unmasked band
            band_lo, band_hi = walk_part(lo, hi, full_lo, full_hi, far_end, BLOCK_N, part)
            acc, m_i, l_i = _fwd_band(
                acc, m_i, l_i, q, k_base, v_base, skn, svn, band_lo, band_hi, q_pos, q_first, offs_n, offs_d, d_ok,
                LK, K0, WINDOW, start_b, doc_q, qk_scale, r1, r2, r3, w_a, w_p, lut_row, MAXD,
                BLOCK_M, BLOCK_N, FAR and part == 1, BIAS, HAS_R2, HAS_R3, HAS_WEIGHT, HAS_WA, HAS_WP, HAS_WINDOW,
                PRECISION, UPCAST, EXACT_PV, HAS_STARTS, HAS_DOCS, part == 0 or part == 3)

    out = acc / l_i[:, None]
    tl.store(OUT + b * sob + h * soh + offs_m[:, None] * som + offs_d[None, :], out.to(OUT.dtype.element_ty),
             mask=row_ok[:, None] & d_ok[None, :])
    tl.store(LSE + bh * LQ + offs_m, (m_i + tl.log2(l_i)) * LN2, mask=row_ok)  # natural log, for the backward
