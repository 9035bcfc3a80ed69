"""How many tiles of each kind the attention kernels walk at a sequence length: the host twin of
megatron/attention/kernels/bands.py for a full causal call (queries = keys = L, no window, no
padding), with KERPLE-log's far split (kernels/distance_bias.py FAR_U).

Kinds: `masked` (the tiles on the diagonal, which evaluate the causal mask), `near` (unmasked
tiles that evaluate the bias per score) and `far` (unmasked KERPLE-log tiles whose centre distance
reaches far_distance, where the log comes from a per-tile series); a scheme without the far split
has only masked and near tiles. Counts are per (batch, head): each kernel runs that many programs
per (batch, head) (key blocks for dk/dv), and every program walks its own band of tiles. Used by
tools/sass_mix.py --model (instructions per tile of each kind times these counts);
tests/unit/test_tile_counts.py checks them against a brute-force reading of the causal mask."""
from __future__ import annotations

import math
from dataclasses import dataclass

# kernels/distance_bias.py FAR_SPAN (1 / FAR_U), as a plain int: that module needs triton.
FAR_SPAN = 8


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def far_distance(r2: float, block_m: int, block_n: int) -> int:
    """kernels/distance_bias.py far_distance: the smallest integer centre distance of a far tile."""
    return math.ceil(FAR_SPAN * ((block_m + block_n - 2) // 2) - 1.0 / r2)


@dataclass(frozen=True)
class Tiles:
    masked: int = 0
    near: int = 0
    far: int = 0
    programs: int = 0

    @property
    def total(self) -> int:
        return self.masked + self.near + self.far

    def __add__(self, other: Tiles) -> Tiles:
        return Tiles(self.masked + other.masked, self.near + other.near, self.far + other.far,
                     self.programs + other.programs)


def _bands(lo: int, hi: int, full_lo: int, full_hi: int, step: int) -> tuple[int, int]:
    """bands.band_bounds: (mid_lo, mid_hi), the unmasked band of the walk lo, lo + step, ... < hi."""
    mid_lo = min(lo + cdiv(max(full_lo - lo, 0), step) * step, hi)
    mid_hi = max(min(lo + cdiv(max(full_hi - lo, 0), step) * step, hi), mid_lo)
    return mid_lo, mid_hi


def _split(first: int, end: int, threshold: int, step: int) -> int:
    """bands.far_split."""
    return min(first + cdiv(max(threshold - first, 0), step) * step, end)


def _walked(first: int, end: int, step: int) -> int:
    return max(cdiv(end - first, step), 0)


def key_walk_tiles(length: int, block_m: int, block_n: int, far_from: int | None, rows_matter: bool) -> Tiles:
    """The forward (rows_matter False) or dq kernel: one program per block of block_m queries, each
    walking key blocks of block_n (bands.key_walk). far_from: far_distance, or None (no far split)."""
    out = Tiles()
    for m in range(cdiv(length, block_m)):
        hi = min(length, (m + 1) * block_m)
        full_lo, full_hi = 0, min(m * block_m + 1, length) - block_n + 1
        if rows_matter and (m + 1) * block_m > length:
            full_hi = full_lo
        mid_lo, mid_hi = _bands(0, hi, full_lo, full_hi, block_n)
        far = 0
        if far_from is not None:  # part 1: the unmasked band's first tiles, up to far_end
            far_end = m * block_m + (block_m - block_n) // 2 - far_from + 1
            far = _walked(mid_lo, _split(mid_lo, mid_hi, far_end, block_n), block_n)
        unmasked = _walked(mid_lo, mid_hi, block_n)
        out += Tiles(_walked(0, hi, block_n) - unmasked, unmasked - far, far, 1)
    return out


def query_walk_tiles(length: int, block_m: int, block_n: int, far_from: int | None) -> Tiles:
    """The dk/dv kernel: one program per block of block_n keys, each walking query blocks of
    block_m (bands.query_walk); the far tiles are the unmasked band's last ones."""
    out = Tiles()
    for n in range(cdiv(length, block_n)):
        lo = (n * block_n // block_m) * block_m
        full_lo, full_hi = (n + 1) * block_n - 1, length - block_m + 1
        if (n + 1) * block_n > length:
            full_hi = full_lo
        mid_lo, mid_hi = _bands(lo, length, full_lo, full_hi, block_m)
        far = 0
        if far_from is not None:  # part 2: from far_start on
            far_start = far_from - (-n * block_n + (block_m - block_n) // 2)
            far = _walked(_split(mid_lo, mid_hi, far_start, block_m), mid_hi, block_m)
        unmasked = _walked(mid_lo, mid_hi, block_m)
        out += Tiles(_walked(lo, length, block_m) - unmasked, unmasked - far, far, 1)
    return out


def kernel_tiles(kernel: str, length: int, block_m: int, block_n: int, far: bool, r2: float = 1.0) -> Tiles:
    """Tiles per (batch, head) of `kernel` ("fwd", "bwd_dkdv", "bwd_dq") at its (block_m, block_n):
    the kernel's own tile (dq's is the mirror of dk/dv's, kernels/tuning.py dq_blocks). far: the
    scheme splits its unmasked band (KERPLE-log), with this r2 (a head's far distance grows by
    1 / r2 as r2 shrinks: r2 = 1 vs 0.1 moves it by 9 positions)."""
    far_from = far_distance(r2, block_m, block_n) if far else None
    if kernel == "bwd_dkdv":
        return query_walk_tiles(length, block_m, block_n, far_from)
    return key_walk_tiles(length, block_m, block_n, far_from, rows_matter=kernel == "bwd_dq")
