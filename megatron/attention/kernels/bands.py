"""Which tiles a kernel visits, and which of them need the causal/window mask.

Each program walks block starts lo, lo + STEP, ... < hi: the tiles that can hold an allowed pair
(fully masked tiles are never visited). Of those, the tiles whose every (query, key) pair is
allowed (behind the diagonal, inside the window, every key in range, no padding; every row in
range too where junk rows would enter a sum) need no mask, no distance clamp and no select: the
starts in [full_lo, full_hi). The walk is split into three consecutive bands, 0 (before them,
masked), 1 (them, unmasked), 2 (after, masked), visited in order, so every sum is formed in the
same order as one loop would form it. tests/unit/test_triton_attention.py checks these bounds
against a brute-force reading of the mask."""
import triton
import triton.language as tl


@triton.jit
def key_walk(start_m, Q0, K0, LQ, LK, WINDOW, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             HAS_WINDOW: tl.constexpr, HAS_STARTS: tl.constexpr, ROWS_MATTER: tl.constexpr):
    """(lo, hi, full_lo, full_hi) over key-block starts for query block start_m (forward, dq).
    ROWS_MATTER: a block with rows past LQ has no unmasked tiles (the dq kernel, where such rows
    would enter no sum but exp(s - 0) could overflow); the forward never stores those rows."""
    # Keys j with K0 + j <= the block's last query position; windowed: d < WINDOW for its first.
    hi = tl.minimum(LK, Q0 + (start_m + 1) * BLOCK_M - K0)
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(0, Q0 + start_m * BLOCK_M - K0 - WINDOW + 1)
        lo = (lo // BLOCK_N) * BLOCK_N
    full_lo = hi
    full_hi = hi
    if not HAS_STARTS:
        full_lo = 0
        # the tile's last key at or before the block's first query, and in range
        full_hi = tl.minimum(Q0 + start_m * BLOCK_M - K0 + 1, LK) - BLOCK_N + 1
        if HAS_WINDOW:  # the block's last query still sees the tile's first key
            full_lo = Q0 + (start_m + 1) * BLOCK_M - K0 - WINDOW
        if ROWS_MATTER:
            full_hi = tl.where((start_m + 1) * BLOCK_M <= LQ, full_hi, full_lo)
    return lo, hi, full_lo, full_hi


@triton.jit
def query_walk(start_n, Q0, K0, LQ, LK, WINDOW, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               HAS_WINDOW: tl.constexpr, HAS_STARTS: tl.constexpr):
    """(lo, hi, full_lo, full_hi) over query-block starts for key block start_n (dk, dv, and the
    parameter partials, where every row enters a sum: rows past LQ are never unmasked)."""
    # Queries that see a key of this block: Q0 + i >= K0 + first key; windowed: d < WINDOW.
    lo = tl.maximum(0, K0 + start_n * BLOCK_N - Q0)
    lo = (lo // BLOCK_M) * BLOCK_M
    hi = LQ
    if HAS_WINDOW:
        hi = tl.minimum(LQ, K0 + (start_n + 1) * BLOCK_N - 1 + WINDOW - Q0)
    full_lo = hi
    full_hi = hi
    if not HAS_STARTS:
        full_lo = K0 + (start_n + 1) * BLOCK_N - 1 - Q0  # first query at or after the block's last key
        full_hi = LQ - BLOCK_M + 1  # every row < LQ
        if HAS_WINDOW:  # the block's last query still sees the block's first key
            full_hi = tl.minimum(full_hi, K0 + start_n * BLOCK_N + WINDOW - Q0 - BLOCK_M + 1)
        full_hi = tl.where((start_n + 1) * BLOCK_N <= LK, full_hi, full_lo)  # every key < LK
    return lo, hi, full_lo, full_hi


@triton.jit
def band_bounds(lo, hi, full_lo, full_hi, STEP: tl.constexpr, BAND: tl.constexpr):
    """(first, end) of band BAND of the walk lo, lo + STEP, ... < hi (lo a multiple of STEP)."""
    mid_lo = tl.minimum(lo + tl.cdiv(tl.maximum(full_lo - lo, 0), STEP) * STEP, hi)
    mid_hi = tl.maximum(tl.minimum(lo + tl.cdiv(tl.maximum(full_hi - lo, 0), STEP) * STEP, hi), mid_lo)
    first = lo
    end = mid_lo
    if BAND == 1:
        first = mid_lo
        end = mid_hi
    if BAND == 2:
        first = mid_hi
        end = hi
    return first, end


@triton.jit
def walk_part(lo, hi, full_lo, full_hi, split, STEP: tl.constexpr, PART: tl.constexpr):
    """(first, end) of part PART of the walk, as every kernel's static loop over 4 parts runs it:
    0 and 3 the masked bands, 1 and 2 the unmasked band cut at `split` (far_split): tiles before
    it in part 1, from it on in part 2. Which of the two is the far one is the caller's walk."""
    first, end = band_bounds(lo, hi, full_lo, full_hi, STEP, PART - PART // 2)
    if PART == 1:
        end = far_split(first, end, split, STEP)
    if PART == 2:
        first = far_split(first, end, split, STEP)
    return first, end


@triton.jit
def far_split(first, end, threshold, STEP: tl.constexpr):
    """The first start of first, first + STEP, ... < end that is >= threshold (end if none): where
    the unmasked band splits between tiles near the diagonal and far ones (kernels/distance_bias.py
    FAR_U), so each part is a loop of its own with one way of computing the bias."""
    return tl.minimum(first + tl.cdiv(tl.maximum(threshold - first, 0), STEP) * STEP, end)


@triton.jit
def document_keys(lo, full_lo, first_start, last_start, BLOCK_N: tl.constexpr):
    """Packed documents (megatron/attention/documents.py), forward and dq: the key walk of a query
    block narrowed to its queries' documents. first_start, last_start: where the documents of the
    block's first and last query begin. A key block before first_start is wholly in earlier
    documents, seen by no query of the block: never visited (skipped, not masked). A tile is
    unmasked only from last_start on (every key in every query's document: starts never decrease
    along a row), the causal bound doing the rest."""
    return tl.maximum(lo, (first_start // BLOCK_N) * BLOCK_N), tl.maximum(full_lo, last_start)


@triton.jit
def document_queries(hi, full_hi, first_end, last_end, BLOCK_M: tl.constexpr):
    """Packed documents, dk/dv: the query walk of a key block narrowed to its keys' documents.
    first_end, last_end: one past the last token of the documents of the block's first and last
    key. A query block from last_end on is wholly in later documents: never visited. A tile is
    unmasked only when all its queries lie before first_end (the causal bound doing the rest)."""
    return tl.minimum(hi, last_end), tl.minimum(full_hi, first_end - BLOCK_M + 1)
