"""Backward Triton kernels for attention_fwd: dq, dk, dv and the positional parameters'
gradients, all without atomics, so two runs give bitwise-identical gradients.

Two kernels recompute the probabilities P = exp(S - lse) from the saved row log-sum-exp:
  * attention_bwd_dkdv_kernel: one program per (block of keys, batch*key/value head); for each
    of the GROUP query heads that read its key/value head (grouped-query attention, H = GROUP *
    H_kv; GROUP 1: multi-head), walks the query blocks that can see its keys; writes dk, dv (the
    sum over the group), and each query head's PARTIAL sums of the scheme's parameter gradients
    into its own slots of PART (B*H, n_key_blocks, NSLOT). The caller adds the partials in a fixed
    order (a torch sum), the deterministic reduction.
  * attention_bwd_dq_kernel: one program per (block of queries, batch*head); reads key/value head
    h // GROUP; writes dq.

With S = S_raw * w + bias (S_raw = q.k * scale) and dS = P * (dP - delta), delta = rowsum(dO * O):
  dq = scale * (dS * w) @ k,  dk = scale * (dS * w)^T @ q,  dv = P^T @ dO
  d(bias param) = sum dS * d bias/d param,  d(weight param) = sum dS * S_raw * d w/d param
Slots: log bias 0 = r1, 1 = r2, 2 = r3; power bias 1 = r2, 2 = r3; weight 3 = w_a, 4 = w_p;
lookup bias with a learned table (LUT_GRAD): slot t = the T5 bucket t (gradient of table[t, h]
before the table's scale); a fixed tabulated lookup (Sandwich) has no parameter gradient.
The table path (a log/power bias tabulated per distance, kernels/bias_table.py; N_JAC > 0): slot k
= sum dS * JAC[k, h, d], the bias table's derivative by its k-th parameter, read like the table."""
import triton
import triton.language as tl

from megatron.attention.kernels.bands import document_keys, document_queries, key_walk, query_walk, walk_part
from megatron.attention.kernels.distance_bias import (
    LN2,
    LOG2E,
    cast,
    far_bias_log2,
    far_coefficients,
    far_distance,
    far_log2,
    load_head_params,
    mm,
    pow_and_log,
    score_bias_log2,
    score_weight,
)
from megatron.attention.kernels.fma_log2 import log2_ge1, small_int_to_float


@triton.jit
def _along_queries(x, KEY_MAJOR: tl.constexpr):
    """A per-query vector broadcast over a tile: queries are axis 0, or axis 1 when KEY_MAJOR."""
    if KEY_MAJOR:  # one return: a jit function's returns must agree in shape
        out = x[None, :]
    else:
        out = x[:, None]
    return out


@triton.jit
def _along_keys(x, KEY_MAJOR: tl.constexpr):
    """A per-key vector broadcast over a tile: keys are axis 1, or axis 0 when KEY_MAJOR."""
    if KEY_MAJOR:
        out = x[:, None]
    else:
        out = x[None, :]
    return out


@triton.jit
def _probabilities(q, k, q_pos, cols, lse, row_ok, col_ok, r1, r2, r3, w_a, w_p, lut_row,
                   K0, WINDOW, sm_scale, start_b, doc_q, center, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   FAR: tl.constexpr, BIAS: tl.constexpr, HAS_R2: tl.constexpr, HAS_R3: tl.constexpr,
                   HAS_WEIGHT: tl.constexpr, HAS_WA: tl.constexpr, HAS_WP: tl.constexpr,
                   HAS_WINDOW: tl.constexpr, MAXD, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                   HAS_STARTS: tl.constexpr, HAS_DOCS: tl.constexpr, MASKED: tl.constexpr,
                   KEY_MAJOR: tl.constexpr):
    """Recompute (P, S_raw, w, d, d_index, L) for a (query block, key block) tile as the forward did,
    in log2 units like the forward (exp2; attention_fwd.py says why): S_raw is returned in log2
    units too (times log2 e); only the weight's gradient needs it, and converts it back.
    KEY_MAJOR: the tile is transposed, (keys, queries) = K Q^T (the dk/dv kernel: why there).
    The distance is an integer difference made a float without I2F (fma_log2.small_int_to_float:
    a conversion per score is a quarter-rate pipe); kept integer, the compiler can evaluate a bias
    once for the scores of a thread that share a distance (seen in dq).
    L = log2(1 + r2 x) of the log bias (0 for other kinds), which its gradients reuse. FAR: an
    unmasked KERPLE-log tile far from the diagonal whose centre distance is `center`: L by the
    series (kernels/distance_bias.py FAR_U), in delta = d - center = i - j - (BLOCK_M - BLOCK_N) / 2."""
    if KEY_MAJOR:
        s_raw = mm(k, tl.trans(q), PRECISION, UPCAST) * (sm_scale * LOG2E)  # (BN, BM) fp32
    else:
        s_raw = mm(q, tl.trans(k), PRECISION, UPCAST) * (sm_scale * LOG2E)  # (BM, BN) fp32
    w = 1.0
    d_index = 0  # the integer distance: the mask's, and a lookup's index
    log2z = 0.0
    if FAR:
        a1, a2, a3, a4, a5, l0 = far_coefficients(center, r2)
        delta = (_along_queries((tl.arange(0, BLOCK_M) - (BLOCK_M - BLOCK_N) // 2).to(tl.float32), KEY_MAJOR)
                 - _along_keys(tl.arange(0, BLOCK_N).to(tl.float32), KEY_MAJOR))  # the same on every tile
        if KEY_MAJOR:  # dk/dv: the gradients of r1 and r2 read the log itself, and d
            log2z = far_log2(delta, a1, a2, a3, a4, a5, l0)
            d = delta + center.to(tl.float32)
            s = s_raw - r1 * log2z
        else:
            d = delta
            s = far_bias_log2(s_raw, delta, a1, a2, a3, a4, a5, l0, r1)
    else:
        d_index = _along_queries(q_pos, KEY_MAJOR) - _along_keys(K0 + cols, KEY_MAJOR)
        if MASKED:  # else the caller knows every pair of the tile is allowed (kernels/bands.py)
            allowed = (d_index >= 0) & _along_keys(col_ok, KEY_MAJOR) & _along_queries(row_ok, KEY_MAJOR)
            if HAS_WINDOW:
                allowed = allowed & (d_index < WINDOW)
            if HAS_STARTS:  # padded rows: megatron/attention/mask.py
                allowed = allowed & ((_along_keys(K0 + cols, KEY_MAJOR) >= start_b) | (d_index == 0))
            if HAS_DOCS:  # packed documents: the key lies in the query's document (doc_q: its start)
                allowed = allowed & (_along_keys(cols, KEY_MAJOR) >= _along_queries(doc_q, KEY_MAJOR))
            d_index = tl.maximum(d_index, 0)
        # Unmasked dk/dv tiles: the distance as a difference of floats (attention_fwd.py FLOAT_D;
        # dk/dv kerple_log near tiles 726 -> 702 loop instructions, alibi 428 -> 404). Not in dq:
        # there the integer distance lets the compiler evaluate the bias once per distinct
        # distance of a thread (kerple_log near tiles 477 from integers, 551 from floats).
        if KEY_MAJOR and not MASKED and BIAS != 3 and not HAS_R3:
            d = (_along_queries(q_pos.to(tl.float32), KEY_MAJOR)
                 - _along_keys((K0 + cols).to(tl.float32), KEY_MAJOR))
        else:
            d = small_int_to_float(d_index)
        s = s_raw
        if HAS_WEIGHT:
            w = score_weight(d, w_a, w_p, HAS_WA, HAS_WP)
            s = s * w
        if BIAS != 0:
            s = s + score_bias_log2(d, d_index, r1, r2, r3, lut_row, BIAS, HAS_R2, HAS_R3, MAXD)
        if BIAS == 1:  # the bias's own log2 (the compiler evaluates it once)
            log2z = log2_ge1(1.0 + r2 * pow_and_log(d, r3, HAS_R3)[0])
    p = tl.exp2(s - _along_queries(lse * LOG2E, KEY_MAJOR))
    if MASKED:
        p = tl.where(allowed, p, 0.0)
    return p, s_raw, w, d, d_index, log2z


@triton.jit
def attention_bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, PART,
    R1, R2, R3, WA, WP, LUT, JAC, BUCKET, STARTS, DOCS,
    sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sdob, sdoh, sdom,
    sdkb, sdkh, sdkn, sdvb, sdvh, sdvn,
    H, LQ, LK, Q0, K0, WINDOW, sm_scale, N_KEY_BLOCKS,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BIAS: tl.constexpr, HAS_R2: tl.constexpr, HAS_R3: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, HAS_WA: tl.constexpr, HAS_WP: tl.constexpr,
    HAS_WINDOW: tl.constexpr, MAXD, NSLOT: tl.constexpr, LUT_GRAD: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, HAS_STARTS: tl.constexpr, N_JAC: tl.constexpr,
    GROUP: tl.constexpr, HAS_DOCS: tl.constexpr,
):
    start_n = tl.program_id(0)
    bkv = tl.program_id(1)  # batch * key/value head (the module docstring: grouped-query heads)
    H_KV = H // GROUP
    b = (bkv // H_KV).to(tl.int64)  # int64: b * stride_b passes 2^31 at long contexts
    h_kv = (bkv % H_KV).to(tl.int64)
    start_b = 0
    if HAS_STARTS:
        start_b = tl.load(STARTS + b)
    cols = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    col_ok = cols < LK
    kv_mask = col_ok[:, None] & d_ok[None, :]
    k = tl.load(K + b * skb + h_kv * skh + cols[:, None] * skn + offs_d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(V + b * svb + h_kv * svh + cols[:, None] * svn + offs_d[None, :], mask=kv_mask, other=0.0)

    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    slots = tl.arange(0, NSLOT)
    # The query blocks that see this key block, and those that need no mask (kernels/bands.py).
    lo, hi, full_lo, full_hi = query_walk(start_n, Q0, K0, LQ, LK, WINDOW, BLOCK_M, BLOCK_N, HAS_WINDOW, HAS_STARTS)
    doc_row = DOCS + b * 2 * LQ  # packed documents: (start, end) of each token's document
    if HAS_DOCS:  # query blocks wholly past the keys' documents are never visited (kernels/bands.py)
        last = tl.minimum(start_n * BLOCK_N + BLOCK_N, LK) - 1
        hi, full_hi = document_queries(hi, full_hi, tl.load(doc_row + LQ + start_n * BLOCK_N),
                                       tl.load(doc_row + LQ + last), BLOCK_M)
    # KERPLE-log's far tiles (kernels/distance_bias.py FAR_U): the query blocks whose centre
    # distance Q0 + start_m - K0 - key start + (BLOCK_M - BLOCK_N) / 2 reaches far_distance, the
    # unmasked band's last ones: walked by a loop of their own (part 2), after the near ones.
    FAR: tl.constexpr = BIAS == 1 and HAS_R2 and not HAS_R3 and not HAS_WEIGHT
    center_shift = Q0 - K0 - start_n * BLOCK_N + (BLOCK_M - BLOCK_N) // 2  # centre = start_m + this
    # Grouped-query attention: the GROUP query heads that read this key/value head are walked one
    # after the other, each adding its dk, dv into the same registers (the sum over the group that
    # dk, dv of a shared head are), each writing its own parameter-gradient partials (the scheme's
    # parameters are per query head). No atomics, so the gradients stay bitwise reproducible, and
    # no (B, H, Lk, D) buffer to reduce afterwards; the K, V tile is loaded once for the group.
    # GROUP is a constexpr: multi-head attention (GROUP 1) compiles to the loop body alone.
    for g in range(GROUP):
        h = h_kv * GROUP + g  # the query head
        bh = b * H + h  # its row of LSE, DELTA and PART
        r1, r2, r3, w_a, w_p = load_head_params(R1, R2, R3, WA, WP, h, BIAS, HAS_R2, HAS_R3, HAS_WA, HAS_WP)
        lut_row = LUT + h * (MAXD + 1)

        # Parameter gradients, summed per key of the tile across the walk and over the keys once
        # after it: a whole-tile sum per step would cross warps (shared memory and a barrier per
        # parameter per tile). Constant factors (-r1, -ln 2, ...) are applied after the walk too.
        g_r1 = tl.zeros([BLOCK_N], dtype=tl.float32)
        g_r2 = tl.zeros([BLOCK_N], dtype=tl.float32)
        g_r3 = tl.zeros([BLOCK_N], dtype=tl.float32)
        g_wa = tl.zeros([BLOCK_N], dtype=tl.float32)
        g_wp = tl.zeros([BLOCK_N], dtype=tl.float32)
        g_table = tl.zeros([NSLOT], dtype=tl.float32)

        far_start = hi  # (FAR above: the start depends on this head's r2)
        if FAR:
            far_start = far_distance(r2, BLOCK_M, BLOCK_N) - center_shift
        for part in tl.static_range(4):  # masked, near unmasked, far unmasked, masked
            band_lo, band_hi = walk_part(lo, hi, full_lo, full_hi, far_start, BLOCK_M, part)
            # (without far tiles part 1 is the whole unmasked band and part 2 an empty loop, compiled away)
            for start_m in range(band_lo, band_hi if part != 2 or FAR else band_lo, BLOCK_M):
                rows = start_m + offs_m
                row_ok = rows < LQ
                q_mask = row_ok[:, None] & d_ok[None, :]
                q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqm + offs_d[None, :], mask=q_mask, other=0.0)
                do = tl.load(DO + b * sdob + h * sdoh + rows[:, None] * sdom + offs_d[None, :], mask=q_mask, other=0.0)
                lse = tl.load(LSE + bh * LQ + rows, mask=row_ok, other=0.0)
                delta = tl.load(DELTA + bh * LQ + rows, mask=row_ok, other=0.0)
                doc_q = rows
                if HAS_DOCS:
                    doc_q = tl.load(doc_row + rows, mask=row_ok, other=0)
                p, s_raw, w, d, d_index, log2z = _probabilities(
                    q, k, Q0 + rows, cols, lse, row_ok, col_ok,
                    r1, r2, r3, w_a, w_p, lut_row, K0, WINDOW, sm_scale, start_b, doc_q, start_m + center_shift,
                    BLOCK_M, BLOCK_N, FAR and part == 2, BIAS, HAS_R2, HAS_R3, HAS_WEIGHT, HAS_WA, HAS_WP, HAS_WINDOW,
                    MAXD, PRECISION, UPCAST, HAS_STARTS, HAS_DOCS, part == 0 or part == 3, True)
                # Key-major tiles (BN, BM): P^T, dP^T, dS^T. All four products then have the key
                # block as their M side, held in registers (P^T, dS^T as wgmma's A operand straight
                # from the accumulators): no transpose through shared memory, and with BLOCK_N >= 64
                # Hopper's warpgroup MMA (a (BM, BN) tile made dv += P^T dO an M = BLOCK_N product
                # read through a transpose, on the older mma.sync path at BLOCK_N = 32).
                dv = mm(cast(p, do.dtype, UPCAST), do, PRECISION, UPCAST, dv)  # into dv on the tensor cores
                dp = mm(v, tl.trans(do), PRECISION, UPCAST)
                ds = p * (dp - delta[None, :])  # dL/dS^T, 0 where masked

                if BIAS == 1:  # -r1 * log(1 + r2 x), x = d**r3: factors -ln 2, -r1, -r1 r2 after the walk
                    x, log_d = pow_and_log(d, r3, HAS_R3)  # (the far tiles have no r3: x = d)
                    g_r1 += tl.sum(ds * log2z, 1)  # log2(1 + r2 x), the bias's
                    # x / den as x * 2^-log2(den): one exp2 on the MUFU, where a division is a
                    # reciprocal plus a Newton step and a slow-path check (FCHK) per score.
                    ds_x_den = ds * (x * tl.exp2(-log2z))
                    g_r2 += tl.sum(ds_x_den, 1)
                    if HAS_R3:
                        g_r3 += tl.sum(ds_x_den * log_d, 1)
                if BIAS == 2:  # -r2 * x, x = d**r3: factors -1, -r2 after the walk
                    x, log_d = pow_and_log(d, r3, HAS_R3)
                    ds_x = ds * x
                    g_r2 += tl.sum(ds_x, 1)
                    if HAS_R3:
                        g_r3 += tl.sum(ds_x * log_d, 1)
                if N_JAC > 0:  # table path: JAC[k, h, d] = d table[h, d] / d param k (kernels/bias_table.py)
                    jac = JAC + h * (MAXD + 1) + tl.minimum(d_index, MAXD)
                    jac_stride = H * (MAXD + 1)
                    g_r1 += tl.sum(ds * tl.load(jac), 1)
                    if N_JAC > 1:
                        g_r2 += tl.sum(ds * tl.load(jac + jac_stride), 1)
                    if N_JAC > 2:
                        g_r3 += tl.sum(ds * tl.load(jac + 2 * jac_stride), 1)
                if LUT_GRAD:  # table[bucket(d), h]: sum dS per bucket
                    bucket = tl.load(BUCKET + tl.minimum(d_index, MAXD))
                    # Buckets grow with d, so the tile only touches those between its smallest and largest
                    # distance: one pass per such bucket (a single one once the tile is past max_distance).
                    d_lo = tl.maximum(Q0 + start_m - (K0 + start_n * BLOCK_N + BLOCK_N - 1), 0)
                    d_hi = tl.maximum(Q0 + start_m + BLOCK_M - 1 - (K0 + start_n * BLOCK_N), 0)
                    b_lo = tl.load(BUCKET + tl.minimum(d_lo, MAXD))
                    b_hi = tl.load(BUCKET + tl.minimum(d_hi, MAXD))
                    for t in range(b_lo, b_hi + 1):
                        g_t = tl.sum(tl.sum(tl.where(bucket == t, ds, 0.0), 1), 0)
                        g_table += tl.where(slots == t, g_t, 0.0)
                if HAS_WEIGHT:  # w = exp(-w_a y), y = d**w_p; dL/dw = dS * S_raw
                    y, log_d = pow_and_log(d, w_p, HAS_WP)
                    dw_y = ds * (s_raw * LN2) * w * y  # S_raw back to natural units; factors -1, -w_a after
                    g_wa += tl.sum(dw_y, 1)
                    if HAS_WP:
                        g_wp += tl.sum(dw_y * log_d, 1)
                    ds = ds * w
                dk = mm(cast(ds, q.dtype, UPCAST), q, PRECISION, UPCAST, dk)

        if not LUT_GRAD:
            # The constant factors of each gradient (see the walk), now that the rows are summed.
            f_r1 = 1.0
            f_r2 = -1.0
            f_r3 = -1.0
            if BIAS == 1:
                f_r1 = -LN2
                f_r2 = -r1
                f_r3 = -r1 * r2
            if BIAS == 2 and HAS_R2:
                f_r3 = -r2
            if N_JAC > 0:  # the table's derivatives carry their own signs and factors
                f_r2 = 1.0
                f_r3 = 1.0
            f_wp = -1.0
            if HAS_WA:
                f_wp = -w_a
            g_table = tl.where(slots == 0, f_r1 * tl.sum(g_r1, 0), g_table)
            g_table = tl.where(slots == 1, f_r2 * tl.sum(g_r2, 0), g_table)
            g_table = tl.where(slots == 2, f_r3 * tl.sum(g_r3, 0), g_table)
            g_table = tl.where(slots == 3, -tl.sum(g_wa, 0), g_table)
            g_table = tl.where(slots == 4, f_wp * tl.sum(g_wp, 0), g_table)
        tl.store(PART + (bh * N_KEY_BLOCKS + start_n) * NSLOT + slots, g_table)

    tl.store(DK + b * sdkb + h_kv * sdkh + cols[:, None] * sdkn + offs_d[None, :],
             cast(dk * sm_scale, DK.dtype.element_ty, UPCAST), mask=kv_mask)
    tl.store(DV + b * sdvb + h_kv * sdvh + cols[:, None] * sdvn + offs_d[None, :],
             cast(dv, DV.dtype.element_ty, UPCAST), mask=kv_mask)


@triton.jit
def attention_bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ,
    R1, R2, R3, WA, WP, LUT, STARTS, DOCS,
    sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sdob, sdoh, sdom, sdqb, sdqh, sdqm,
    H, LQ, LK, Q0, K0, WINDOW, sm_scale,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BIAS: tl.constexpr, HAS_R2: tl.constexpr, HAS_R3: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, HAS_WA: tl.constexpr, HAS_WP: tl.constexpr,
    HAS_WINDOW: tl.constexpr, MAXD, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    HAS_STARTS: tl.constexpr, GROUP: tl.constexpr, HAS_DOCS: tl.constexpr,
):
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)  # int64: b * stride_b passes 2^31 at long contexts
    h = (bh % H).to(tl.int64)
    h_kv = h // GROUP  # the key/value head this query head reads
    start_b = 0
    if HAS_STARTS:
        start_b = tl.load(STARTS + b)
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    row_ok = rows < LQ
    q_mask = row_ok[:, None] & d_ok[None, :]
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqm + offs_d[None, :], mask=q_mask, other=0.0)
    do = tl.load(DO + b * sdob + h * sdoh + rows[:, None] * sdom + offs_d[None, :], mask=q_mask, other=0.0)
    lse = tl.load(LSE + bh * LQ + rows, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + bh * LQ + rows, mask=row_ok, other=0.0)

    r1, r2, r3, w_a, w_p = load_head_params(R1, R2, R3, WA, WP, h, BIAS, HAS_R2, HAS_R3, HAS_WA, HAS_WP)
    lut_row = LUT + h * (MAXD + 1)

    # The key blocks this query block sees, and those that need no mask (kernels/bands.py).
    lo, hi, full_lo, full_hi = key_walk(start_m, Q0, K0, LQ, LK, WINDOW, BLOCK_M, BLOCK_N, HAS_WINDOW,
                                        HAS_STARTS, True)
    doc_q = rows  # (unused without documents)
    if HAS_DOCS:  # key blocks wholly before the queries' documents are never visited (kernels/bands.py)
        doc_row = DOCS + b * 2 * LQ
        doc_q = tl.load(doc_row + rows, mask=row_ok, other=0)
        last = tl.minimum(start_m * BLOCK_M + BLOCK_M, LQ) - 1
        lo, full_lo = document_keys(lo, full_lo, tl.load(doc_row + start_m * BLOCK_M), tl.load(doc_row + last),
                                    BLOCK_N)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # KERPLE-log's far tiles (kernels/distance_bias.py FAR_U): the key blocks whose centre distance
    # Q0 + start_m * BLOCK_M - K0 - start_n + (BLOCK_M - BLOCK_N) / 2 reaches far_distance, the
    # unmasked band's first ones: walked by a loop of their own (part 1), before the near ones.
    FAR: tl.constexpr = BIAS == 1 and HAS_R2 and not HAS_R3 and not HAS_WEIGHT
    far_end = hi
    center_shift = Q0 + start_m * BLOCK_M - K0 + (BLOCK_M - BLOCK_N) // 2  # centre = this - start_n
    if FAR:
        far_end = center_shift - far_distance(r2, BLOCK_M, BLOCK_N) + 1
    for part in tl.static_range(4):  # masked, far unmasked, near unmasked, masked
        band_lo, band_hi = walk_part(lo, hi, full_lo, full_hi, far_end, BLOCK_N, part)
        # (without far tiles part 1 is the whole unmasked band and part 2 an empty loop, compiled away)
        for start_n in range(band_lo, band_hi if part != 2 or FAR else band_lo, BLOCK_N):
            cols = start_n + offs_n
            col_ok = cols < LK
            kv_mask = col_ok[:, None] & d_ok[None, :]
            k = tl.load(K + b * skb + h_kv * skh + cols[:, None] * skn + offs_d[None, :], mask=kv_mask, other=0.0)
            v = tl.load(V + b * svb + h_kv * svh + cols[:, None] * svn + offs_d[None, :], mask=kv_mask, other=0.0)
            p, s_raw, w, d, d_index, log2z = _probabilities(
                q, k, Q0 + rows, cols, lse, row_ok, col_ok,
                r1, r2, r3, w_a, w_p, lut_row, K0, WINDOW, sm_scale, start_b, doc_q, center_shift - start_n,
                BLOCK_M, BLOCK_N, FAR and part == 1, BIAS, HAS_R2, HAS_R3, HAS_WEIGHT, HAS_WA, HAS_WP, HAS_WINDOW,
                MAXD, PRECISION, UPCAST, HAS_STARTS, HAS_DOCS, part == 0 or part == 3, False)
            dp = mm(do, tl.trans(v), PRECISION, UPCAST)
            ds = p * (dp - delta[:, None])
            if HAS_WEIGHT:
                ds = ds * w
            dq = mm(cast(ds, k.dtype, UPCAST), k, PRECISION, UPCAST, dq)
    tl.store(DQ + b * sdqb + h * sdqh + rows[:, None] * sdqm + offs_d[None, :],
             cast(dq * sm_scale, DQ.dtype.element_ty, UPCAST), mask=q_mask)
