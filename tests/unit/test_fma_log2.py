"""kernels/fma_log2.py: the FMA-pipe log2 that the KERPLE-log bias and its gradients use, against
float64 log2 over every argument kind the kernels pass (1 + r2 * d for small and large r2, integer
distances, arguments up to 2^24). Runs the Triton function itself (the interpreter on CPU)."""
import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from megatron.kernels.fma_log2 import log2_ge1
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
