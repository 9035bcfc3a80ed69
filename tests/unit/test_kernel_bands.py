"""The kernels' walks (megatron/attention/kernels/bands.py) against a brute-force reading of the mask: the
tiles a program skips hold no allowed pair, the unmasked band holds only fully allowed tiles, and
the three bands partition the walk in order. Run in Triton's interpreter on CPU (a probe kernel
stores each program's band bounds); thousands of shapes, no attention computed."""
import itertools

import pytest

triton = pytest.importorskip("triton")
import torch  # noqa: E402
import triton.language as tl  # noqa: E402

from megatron.attention.kernels.bands import band_bounds, key_walk, query_walk  # noqa: E402

pytestmark = pytest.mark.gpu  # compiled on a GPU (make test-gpu), Triton's interpreter on CPU
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@triton.jit
def _probe(OUT, Q0, K0, LQ, LK, WINDOW, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
           HAS_WINDOW: tl.constexpr, BY_QUERY: tl.constexpr, ROWS_MATTER: tl.constexpr):
    pid = tl.program_id(0)
    if BY_QUERY:  # a query block walking key blocks (forward, dq)
        lo, hi, full_lo, full_hi = key_walk(pid, Q0, K0, LQ, LK, WINDOW, BLOCK_M, BLOCK_N, HAS_WINDOW, False,
                                            ROWS_MATTER)
        step: tl.constexpr = BLOCK_N
    else:  # a key block walking query blocks (dk, dv)
        lo, hi, full_lo, full_hi = query_walk(pid, Q0, K0, LQ, LK, WINDOW, BLOCK_M, BLOCK_N, HAS_WINDOW, False)
        step: tl.constexpr = BLOCK_M
    for band in tl.static_range(3):
        first, end = band_bounds(lo, hi, full_lo, full_hi, step, band)
        tl.store(OUT + pid * 6 + 2 * band, first)
        tl.store(OUT + pid * 6 + 2 * band + 1, end)


def allowed(i, j, q0, k0, lq, lk, window, rows_matter=True):
    d = (q0 + i) - (k0 + j)
    return (i < lq or not rows_matter) and j < lk and d >= 0 and (window is None or d < window)


def check(by_query, q0, k0, lq, lk, window, bm, bn, rows_matter):
    own, other, n_own, n_other = (bm, bn, lq, lk) if by_query else (bn, bm, lk, lq)
    programs = triton.cdiv(n_own, own)
    out = torch.zeros(programs * 6, dtype=torch.int32, device=DEVICE)
    _probe[(programs,)](out, q0, k0, lq, lk, window or 0, BLOCK_M=bm, BLOCK_N=bn, HAS_WINDOW=window is not None,
                        BY_QUERY=by_query, ROWS_MATTER=rows_matter)
    bounds = out.view(programs, 3, 2).tolist()
    for p, bands in enumerate(bounds):
        where = f"by_query={by_query} program {p}: q0={q0} k0={k0} lq={lq} lk={lk} window={window} blocks={bm},{bn}"
        assert bands[0][1] == bands[1][0] and bands[1][1] == bands[2][0], where
        lo, hi = bands[0][0], bands[2][1]
        visited = set(range(lo, hi, other)) if hi > lo else set()

        def pairs(t, p=p):
            tile = range(t, t + other)
            mine = range(p * own, p * own + own)
            return [(i, j) for i in (mine if by_query else tile) for j in (tile if by_query else mine)]

        for t in range(0, triton.cdiv(n_other, other) * other, other):
            any_allowed = any(allowed(i, j, q0, k0, lq, lk, window) for i, j in pairs(t))
            if t not in visited:
                assert not any_allowed, f"{where}: skipped tile {t} has an allowed pair"
                continue
            full = all(allowed(i, j, q0, k0, lq, lk, window, rows_matter) for i, j in pairs(t))
            in_middle = bands[1][0] <= t < bands[1][1]
            assert in_middle == full, f"{where}: tile {t} fully allowed={full} but unmasked={in_middle}"


@pytest.mark.parametrize("by_query, rows_matter", [(True, False), (True, True), (False, True)],
                         ids=["forward", "dq", "dkdv"])
@pytest.mark.parametrize("bm, bn", [(16, 16), (32, 16), (16, 32)])
def test_walks_match_the_mask(by_query, rows_matter, bm, bn):
    g = torch.Generator().manual_seed(bm * 7 + bn + by_query + 2 * rows_matter)
    # Every residue of the query/key offset modulo the blocks (off-by-one errors in a bound show
    # at one residue only), with and without windows of both parities.
    cases = list(itertools.product(range(33), [None, 1, 17, 32]))
    for shift, window in cases:
        lk = int(torch.randint(1, 80, (1,), generator=g))
        lq = int(torch.randint(1, lk + 1, (1,), generator=g))
        k0 = int(torch.randint(0, 5, (1,), generator=g))
        q0 = k0 + (lk - lq) + shift  # kv-cache rows (shift 0) and further along
        check(by_query, q0, k0, lq, lk, window, bm, bn, rows_matter)
