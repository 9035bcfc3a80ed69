"""Backward Triton kernels for attention_fwd: dq, dk, dv and the positional parameters'
gradients, all without atomics, so two runs give bitwise-identical gradients.

Two kernels recompute the probabilities P = exp(S - lse) from the saved row log-sum-exp:
  * attention_bwd_dkdv_kernel: one program per (block of keys, batch*head); walks the query
    blocks that can see its keys; writes dk, dv, and this program's PARTIAL sums of the scheme's
    parameter gradients into its own slots of PART (B*H, n_key_blocks, NSLOT). The caller adds
    the partials in a fixed order (a torch sum), the deterministic reduction.
  * attention_bwd_dq_kernel: one program per (block of queries, batch*head); writes dq.

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

from megatron.kernels.bands import band_bounds, key_walk, query_walk
from megatron.kernels.distance_bias import LN2, LOG2E, cast, load_head_params, mm, pow_and_log, score_bias_log2, score_weight
from megatron.kernels.fma_log2 import log2_ge1


@triton.jit
def _probabilities(q, k, q_pos, cols, lse, row_ok, col_ok, r1, r2, r3, w_a, w_p, lut_row,
                   K0, WINDOW, sm_scale, start_b,
                   BIAS: tl.constexpr, HAS_R2: tl.constexpr, HAS_R3: tl.constexpr,
                   HAS_WEIGHT: tl.constexpr, HAS_WA: tl.constexpr, HAS_WP: tl.constexpr,
                   HAS_WINDOW: tl.constexpr, MAXD, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                   HAS_STARTS: tl.constexpr, MASKED: tl.constexpr):
    """Recompute (P, S_raw, w, d, d_index) for a (query block, key block) tile as the forward did,
    in log2 units like the forward (exp2; attention_fwd.py says why): S_raw is returned in log2
    units too (times log2 e); only the weight's gradient needs it, and converts it back."""
    s_raw = mm(q, tl.trans(k), PRECISION, UPCAST) * (sm_scale * LOG2E)  # (BM, BN) fp32
    d_index = q_pos[:, None] - (K0 + cols)[None, :]
    if MASKED:  # else the caller knows every pair of the tile is allowed (kernels/bands.py)
        allowed = (d_index >= 0) & col_ok[None, :] & row_ok[:, None]
        if HAS_WINDOW:
            allowed = allowed & (d_index < WINDOW)
        if HAS_STARTS:  # padded rows: megatron/attention/mask.py
            allowed = allowed & (((K0 + cols)[None, :] >= start_b) | (d_index == 0))
        d_index = tl.maximum(d_index, 0)
    d = d_index.to(tl.float32)
    s = s_raw
    w = 1.0
    if HAS_WEIGHT:
        w = score_weight(d, w_a, w_p, HAS_WA, HAS_WP)
        s = s * w
    if BIAS != 0:
        s = s + score_bias_log2(d, d_index, r1, r2, r3, lut_row, BIAS, HAS_R2, HAS_R3, MAXD)
    p = tl.exp2(s - (lse * LOG2E)[:, None])
    if MASKED:
        p = tl.where(allowed, p, 0.0)
    return p, s_raw, w, d, d_index


@triton.jit
def attention_bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, PART,
    R1, R2, R3, WA, WP, LUT, JAC, BUCKET, STARTS,
    sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sdob, sdoh, sdom,
    sdkb, sdkh, sdkn, sdvb, sdvh, sdvn,
    H, LQ, LK, Q0, K0, WINDOW, sm_scale, N_KEY_BLOCKS,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BIAS: tl.constexpr, HAS_R2: tl.constexpr, HAS_R3: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, HAS_WA: tl.constexpr, HAS_WP: tl.constexpr,
    HAS_WINDOW: tl.constexpr, MAXD, NSLOT: tl.constexpr, LUT_GRAD: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, HAS_STARTS: tl.constexpr, N_JAC: tl.constexpr,
):
    start_n = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)  # int64: b * stride_b passes 2^31 at long contexts
    h = (bh % H).to(tl.int64)
    start_b = 0
    if HAS_STARTS:
        start_b = tl.load(STARTS + b)
    cols = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    col_ok = cols < LK
    kv_mask = col_ok[:, None] & d_ok[None, :]
    k = tl.load(K + b * skb + h * skh + cols[:, None] * skn + offs_d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(V + b * svb + h * svh + cols[:, None] * svn + offs_d[None, :], mask=kv_mask, other=0.0)

    r1, r2, r3, w_a, w_p = load_head_params(R1, R2, R3, WA, WP, h, BIAS, HAS_R2, HAS_R3, HAS_WA, HAS_WP)
    lut_row = LUT + h * (MAXD + 1)

    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    # Parameter gradients, summed per query row of the tile across the walk and over the rows
    # once after it: a whole-tile sum per step would cross warps (shared memory and a barrier
    # per parameter per tile). Constant factors (-r1, -ln 2, ...) are applied after the walk too.
    g_r1 = tl.zeros([BLOCK_M], dtype=tl.float32)
    g_r2 = tl.zeros([BLOCK_M], dtype=tl.float32)
    g_r3 = tl.zeros([BLOCK_M], dtype=tl.float32)
    g_wa = tl.zeros([BLOCK_M], dtype=tl.float32)
    g_wp = tl.zeros([BLOCK_M], dtype=tl.float32)
    slots = tl.arange(0, NSLOT)
    g_table = tl.zeros([NSLOT], dtype=tl.float32)

    # The query blocks that see this key block, and those that need no mask (kernels/bands.py).
    lo, hi, full_lo, full_hi = query_walk(start_n, Q0, K0, LQ, LK, WINDOW, BLOCK_M, BLOCK_N, HAS_WINDOW, HAS_STARTS)
    for band in tl.static_range(3):
        band_lo, band_hi = band_bounds(lo, hi, full_lo, full_hi, BLOCK_M, band)
        for start_m in range(band_lo, band_hi, BLOCK_M):
            rows = start_m + offs_m
            row_ok = rows < LQ
            q_mask = row_ok[:, None] & d_ok[None, :]
            q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqm + offs_d[None, :], mask=q_mask, other=0.0)
            do = tl.load(DO + b * sdob + h * sdoh + rows[:, None] * sdom + offs_d[None, :], mask=q_mask, other=0.0)
            lse = tl.load(LSE + bh * LQ + rows, mask=row_ok, other=0.0)
            delta = tl.load(DELTA + bh * LQ + rows, mask=row_ok, other=0.0)
            p, s_raw, w, d, d_index = _probabilities(
                q, k, Q0 + rows, cols, lse, row_ok, col_ok, r1, r2, r3, w_a, w_p, lut_row, K0, WINDOW,
                sm_scale, start_b, BIAS, HAS_R2, HAS_R3, HAS_WEIGHT, HAS_WA, HAS_WP, HAS_WINDOW, MAXD, PRECISION,
                UPCAST, HAS_STARTS, band != 1)
            dv += mm(tl.trans(cast(p, do.dtype, UPCAST)), do, PRECISION, UPCAST)
            dp = mm(do, tl.trans(v), PRECISION, UPCAST)
            ds = p * (dp - delta[:, None])  # dL/dS, 0 where masked

            if BIAS == 1:  # -r1 * log(1 + r2 x), x = d**r3: factors -ln 2, -r1, -r1 r2 after the walk
                x, log_d = pow_and_log(d, r3, HAS_R3)
                den = 1.0 + r2 * x
                g_r1 += tl.sum(ds * log2_ge1(den), 1)  # the same log2 as the bias's (one evaluation)
                ds_x_den = ds * (x / den)
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
            dk += mm(tl.trans(cast(ds, q.dtype, UPCAST)), q, PRECISION, UPCAST)

    tl.store(DK + b * sdkb + h * sdkh + cols[:, None] * sdkn + offs_d[None, :],
             cast(dk * sm_scale, DK.dtype.element_ty, UPCAST), mask=kv_mask)
    tl.store(DV + b * sdvb + h * sdvh + cols[:, None] * sdvn + offs_d[None, :],
             cast(dv, DV.dtype.element_ty, UPCAST), mask=kv_mask)
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


@triton.jit
def attention_bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ,
    R1, R2, R3, WA, WP, LUT, STARTS,
    sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sdob, sdoh, sdom, sdqb, sdqh, sdqm,
    H, LQ, LK, Q0, K0, WINDOW, sm_scale,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BIAS: tl.constexpr, HAS_R2: tl.constexpr, HAS_R3: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, HAS_WA: tl.constexpr, HAS_WP: tl.constexpr,
    HAS_WINDOW: tl.constexpr, MAXD, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    HAS_STARTS: tl.constexpr,
):
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)  # int64: b * stride_b passes 2^31 at long contexts
    h = (bh % H).to(tl.int64)
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
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for band in tl.static_range(3):
        band_lo, band_hi = band_bounds(lo, hi, full_lo, full_hi, BLOCK_N, band)
        for start_n in range(band_lo, band_hi, BLOCK_N):
            cols = start_n + offs_n
            col_ok = cols < LK
            kv_mask = col_ok[:, None] & d_ok[None, :]
            k = tl.load(K + b * skb + h * skh + cols[:, None] * skn + offs_d[None, :], mask=kv_mask, other=0.0)
            v = tl.load(V + b * svb + h * svh + cols[:, None] * svn + offs_d[None, :], mask=kv_mask, other=0.0)
            p, s_raw, w, d, d_index = _probabilities(
                q, k, Q0 + rows, cols, lse, row_ok, col_ok, r1, r2, r3, w_a, w_p, lut_row, K0, WINDOW,
                sm_scale, start_b, BIAS, HAS_R2, HAS_R3, HAS_WEIGHT, HAS_WA, HAS_WP, HAS_WINDOW, MAXD, PRECISION,
                UPCAST, HAS_STARTS, band != 1)
            dp = mm(do, tl.trans(v), PRECISION, UPCAST)
            ds = p * (dp - delta[:, None])
            if HAS_WEIGHT:
                ds = ds * w
            dq += mm(cast(ds, k.dtype, UPCAST), k, PRECISION, UPCAST)
    tl.store(DQ + b * sdqb + h * sdqh + rows[:, None] * sdqm + offs_d[None, :],
             cast(dq * sm_scale, DQ.dtype.element_ty, UPCAST), mask=q_mask)
