"""The table path's tables (megatron/attention/kernels/bias_table.py) against hand-written closed forms: the
bias T[h, d] and its derivatives by each parameter, which the backward kernel contracts with dS.
No Triton needed: these are torch computations from the scheme's description."""
import pytest
import torch

from megatron.attention.kernels.bias_table import bias_jacobians, bias_path, bias_table, table_length
from megatron.positional.distance_kernel import DistanceKernel

R1, R2, R3 = torch.tensor([0.7, 1.9]), torch.tensor([0.05, 1.3]), torch.tensor([0.4, 1.6])
D = torch.arange(50, dtype=torch.float64)


def closed_log(r1, r2, r3=None):
    x = D ** (1.0 if r3 is None else r3.double()[:, None])
    return -r1.double()[:, None] * torch.log1p(r2.double()[:, None] * x)


def test_log_table_and_derivatives():
    kernel = DistanceKernel(bias="log", r1=R1, r2=R2)
    torch.testing.assert_close(bias_table(kernel, 50, torch.device("cpu")).double(), closed_log(R1, R2),
                               rtol=1e-6, atol=1e-6)
    j = bias_jacobians(kernel, ["r1", "r2"], 50, torch.device("cpu")).double()
    r1, r2 = R1.double()[:, None], R2.double()[:, None]
    torch.testing.assert_close(j[0], -torch.log1p(r2 * D), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(j[1], -r1 * D / (1 + r2 * D), rtol=1e-6, atol=1e-6)


def test_power_derivatives_are_finite_at_distance_zero():
    """d/dp d**p = d**p log d: 0 at d = 0 (pow_distance's guard), never NaN."""
    kernel = DistanceKernel(bias="power", r2=R2, r3=R3)
    j = bias_jacobians(kernel, ["r2", "r3"], 50, torch.device("cpu")).double()
    p, a = R3.double()[:, None], R2.double()[:, None]
    dp = torch.where(D > 0, D ** p, torch.zeros_like(D))
    torch.testing.assert_close(j[0], -dp, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(j[1], -a * dp * torch.log(D.clamp_min(1)), rtol=1e-5, atol=1e-5)
    assert torch.isfinite(j).all() and (j[:, :, 0] == 0).all()


def test_three_parameter_log_derivative_by_its_exponent():
    kernel = DistanceKernel(bias="log", r1=R1, r2=R2, r3=R3)
    j = bias_jacobians(kernel, ["r3"], 50, torch.device("cpu"))[0].double()
    eps = 1e-6
    numeric = (closed_log(R1, R2, R3.double() + eps) - closed_log(R1, R2, R3.double() - eps)) / (2 * eps)
    torch.testing.assert_close(j, numeric, rtol=1e-4, atol=1e-5)


def test_bias_path_choice(monkeypatch):
    log, alibi = DistanceKernel(bias="log", r1=R1, r2=R2), DistanceKernel(bias="power", r2=R2)
    monkeypatch.delenv("KERPLE_TRITON_BIAS", raising=False)
    assert bias_path(log) == "inline" and bias_path(alibi) == "inline"  # bias_table.py: why
    # a learned exponent too (H200: the table path's gathers cost more than per-score math)
    assert bias_path(DistanceKernel(bias="power", r2=R2, r3=R3)) == "inline"
    assert bias_path(DistanceKernel(bias="log", r1=R1, r2=R2, r3=R3)) == "inline"
    assert bias_path(DistanceKernel.plain(), "table") == "inline"
    assert bias_path(alibi, "table") == "table" and bias_path(log, "inline") == "inline"
    monkeypatch.setenv("KERPLE_TRITON_BIAS", "table")
    assert bias_path(log) == "table" and bias_path(log, "inline") == "inline"
    with pytest.raises(ValueError, match="expected one of auto, table, inline"):
        bias_path(log, "fast")


@pytest.mark.parametrize("q0, lq, k0, n", [(0, 512, 0, 512), (1000, 6, 0, 1006), (7, 1, 7, 1), (0, 3, 5, 1)])
def test_table_length_covers_exactly_the_call(q0, lq, k0, n):
    assert table_length(q0, lq, k0) == n
