"""kernels/fma_log2.py: the FMA-pipe log2 that the KERPLE-log bias and its gradients use, against
float64 log2 over every argument kind the kernels pass (1 + r2 * d for small and large r2, integer
distances, arguments up to 2^24); and the far tiles' series for the same log (distance_bias.py
FAR_U). Runs the Triton functions themselves (the interpreter on CPU)."""
import math

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from megatron.attention.kernels.distance_bias import far_coefficients, far_log2
from megatron.attention.kernels.fma_log2 import log2_ge1
from tests.conftest import KERNEL_DEVICE


@triton.jit
def _log2_kernel(X, Y, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < N
    tl.store(Y + offs, log2_ge1(tl.load(X + offs, mask=ok, other=1.0)), mask=ok)


def _log2(x: torch.Tensor) -> torch.Tensor:
    x = x.to(KERNEL_DEVICE)
    y = torch.empty_like(x)
    block = 4096
    _log2_kernel[(triton.cdiv(x.numel(), block),)](x, y, x.numel(), BLOCK=block)
    return y.cpu()


def test_log2_is_within_fp32_rounding_over_the_kernels_arguments():
    gen = torch.Generator().manual_seed(0)
    d = torch.arange(0, 70000, dtype=torch.float64)
    args = [1 + r2 * d for r2 in (0.01, 0.37, 1.0, 7.5)]  # the log bias's 1 + r2 d
    args += [d[1:], torch.exp2(torch.rand(20000, generator=gen, dtype=torch.float64) * 24),  # distances; up to 2^24
             1 + torch.rand(20000, generator=gen, dtype=torch.float64) * 2,  # every mantissa, reduction boundaries
             torch.tensor([1.0, 1.5, 0.75 * 2, 0.75 * 4, 3.0 - 2**-22, 2.0**23])]
    x = torch.cat(args).float()
    got = _log2(x).double()
    want = torch.log2(x.double())
    abs_err = (got - want).abs()
    assert got[0].item() == 0.0  # log2(1) is exactly 0: the bias at distance 0 vanishes
    assert abs_err.max().item() < 1.5e-6  # fp32 itself rounds log2 ~ 24 to 1e-6
    rel = abs_err[want > 0] / want[want > 0]
    assert rel.max().item() < 5e-7


@pytest.mark.parametrize("z", [1.0 + 2**-23, 1.0001, 1.01])
def test_log2_keeps_relative_accuracy_near_one(z):
    """Near z = 1 (d = 1 with a small r2) the bias is tiny; it must not be swamped by the exponent."""
    got = _log2(torch.tensor([z], dtype=torch.float32)).double().item()
    want = np.log2(np.float64(np.float32(z)))
    assert got == pytest.approx(want, rel=5e-7)


@triton.jit
def _far_kernel(R2, CENTER, DELTA, Y, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < N
    a1, a2, a3, a4, a5, l0 = far_coefficients(tl.load(CENTER), tl.load(R2))
    tl.store(Y + offs, far_log2(tl.load(DELTA + offs, mask=ok, other=0.0), a1, a2, a3, a4, a5, l0), mask=ok)


@pytest.mark.parametrize("r2", [0.01, 0.37, 1.0, 7.5, 300.0])
@pytest.mark.parametrize("blocks", [(16, 16), (128, 64)])
def test_far_tile_series_is_within_its_stated_bound(r2, blocks):
    """kernels/distance_bias.py FAR_U: on the nearest far tile (the centre at far_distance, where
    |u| reaches 1/8) and farther, the series log2(1 + r2 d) is within 1.1e-6 of float64's."""
    half = (sum(blocks) - 2) // 2
    r2_32 = float(np.float32(r2))
    first = max(math.ceil(8 * half - 1 / r2_32), half)  # far_distance, at least R: distances >= 0
    delta = torch.arange(-half, half + 1, dtype=torch.float32)
    for center in (first, first + 1, 3 * first + 7, 65536):
        y = torch.empty_like(delta)
        _far_kernel[(1,)](torch.tensor([r2_32]), torch.tensor([center], dtype=torch.int32), delta, y,
                          delta.numel(), BLOCK=triton.next_power_of_2(delta.numel()))
        want = np.log2(1 + r2_32 * (center + delta.double().numpy()))
        assert np.abs(y.double().numpy() - want).max() < 1.1e-6 + 2e-7 * want.max()  # + fp32 rounding
