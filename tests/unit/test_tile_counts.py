"""benchmarks/tile_counts.py (the SASS cost model's tile counts, tools/sass_mix.py --model) against
a brute-force reading of the causal mask: every (query block, key block) tile of an L x L causal
call, classified from its (query, key) pairs."""
from fractions import Fraction

import numpy as np
import pytest

from benchmarks.tile_counts import Tiles, cdiv, far_distance, kernel_tiles

FAR_U = Fraction(1, 8)  # kernels/distance_bias.py


def brute_force(kernel: str, length: int, block_m: int, block_n: int, r2: Fraction | None) -> Tiles:
    """Every kernel's tile is block_m queries x block_n keys. A tile is walked when one of its real
    pairs is allowed (key <= query); unmasked when every pair is allowed and every key is real (and
    every query too, where the kernel sums over rows: dq and dk/dv); far (r2 given) when unmasked
    and the log's series holds over it: r2 |d - D| <= FAR_U (1 + r2 D) for every distance d of the
    tile, D the tile's centre distance (kernels/distance_bias.py)."""
    rows_matter = kernel != "fwd"
    n_q, n_k = cdiv(length, block_m), cdiv(length, block_n)
    i = np.arange(n_q * block_m)[:, None]
    j = np.arange(n_k * block_n)[None, :]
    real = (i < length) & (j < length)
    allowed = (j <= i) & real
    full = (j <= i) & (j < length) & ((i < length) | (not rows_matter))  # rows past L: don't care in fwd
    out = Tiles(programs=n_k if kernel == "bwd_dkdv" else n_q)
    for qb in range(n_q):
        for kb in range(n_k):
            tile = np.s_[qb * block_m:(qb + 1) * block_m, kb * block_n:(kb + 1) * block_n]
            if not allowed[tile].any():
                continue
            if not full[tile].all():
                out += Tiles(masked=1)
                continue
            d = (i[tile[0]] - j[:, tile[1]]).ravel()
            centre, spread = Fraction(int(d.max() + d.min()), 2), Fraction(int(d.max() - d.min()), 2)
            far = r2 is not None and r2 * spread <= FAR_U * (1 + r2 * centre)
            out += Tiles(far=1) if far else Tiles(near=1)
    return out


BLOCKS = [(128, 64), (32, 64), (64, 32), (64, 64), (16, 16)]


@pytest.mark.parametrize("kernel", ["fwd", "bwd_dkdv", "bwd_dq"])
@pytest.mark.parametrize("blocks", BLOCKS, ids=[f"{m}x{n}" for m, n in BLOCKS])
@pytest.mark.parametrize("length", [1, 63, 64, 100, 257, 1000])
def test_masked_and_unmasked_tiles(kernel, blocks, length):
    assert kernel_tiles(kernel, length, *blocks, far=False) == brute_force(kernel, length, *blocks, None)


@pytest.mark.parametrize("kernel", ["fwd", "bwd_dkdv", "bwd_dq"])
@pytest.mark.parametrize("blocks", [(128, 64), (32, 64), (64, 32), (16, 16)], ids=lambda b: f"{b[0]}x{b[1]}")
# r2 = 1/8 and 1/24: a tile centre lands exactly on the far distance (the boundary tile is far)
@pytest.mark.parametrize("length,r2", [(2048, Fraction(1)), (2000, Fraction(1, 10)), (777, Fraction(1, 2)),
                                       (1500, Fraction(1, 8)), (2048, Fraction(1, 24))])
def test_far_tiles(kernel, blocks, length, r2):
    got = kernel_tiles(kernel, length, *blocks, far=True, r2=float(r2))
    assert got == brute_force(kernel, length, *blocks, r2)
    if length >= 2 * far_distance(float(r2), *blocks) + 2 * max(blocks):
        assert got.far > 0 and got.near > 0


def test_far_share_grows_with_length():
    """At the forward's 128 x 64 tile nearly every tile is far by 16k (the kernels' premise)."""
    shares = [kernel_tiles("fwd", n, 128, 64, far=True).far / kernel_tiles("fwd", n, 128, 64, far=True).total
              for n in (2048, 4096, 16384)]
    assert shares == sorted(shares) and shares[0] < 0.5 < shares[-1] and shares[-1] > 0.85
    assert kernel_tiles("fwd", 512, 128, 64, far=True).far == 0  # the 162M step's length: no far tile
