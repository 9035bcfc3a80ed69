"""Every init method NeoX's init_functions.py accepts builds the same distribution here (its
`_get`): normal, scaled_normal, orthogonal, scaled_orthogonal, xavier_*, wang_init, small_init and
Mamba's single_residual_scaled_normal."""
import math

import pytest
import torch

from megatron.config.model import INIT_METHODS
from megatron.model.init import build_init

STD, LAYERS, HIDDEN = 0.02, 8, 256


@pytest.mark.parametrize("name,expected_std", [
    ("normal", STD),
    ("scaled_normal", STD / math.sqrt(2 * LAYERS)),
    ("single_residual_scaled_normal", STD / math.sqrt(LAYERS)),
    ("small_init", math.sqrt(2 / (5 * HIDDEN))),
    ("wang_init", 2 / (LAYERS * math.sqrt(HIDDEN))),
])
def test_normal_inits_have_neox_std(name, expected_std):
    torch.manual_seed(0)
    w = torch.empty(512, 512)
    build_init(name, STD, LAYERS, HIDDEN)(w)
    assert w.std().item() == pytest.approx(expected_std, rel=0.02)


@pytest.mark.parametrize("name,gain", [("orthogonal", math.sqrt(2)), ("scaled_orthogonal", math.sqrt(2 / LAYERS))])
def test_orthogonal_inits_are_scaled_semi_orthogonal(name, gain):
    w = torch.empty(64, 256)
    build_init(name, STD, LAYERS, HIDDEN)(w)
    torch.testing.assert_close(w @ w.T, gain ** 2 * torch.eye(64), atol=1e-4, rtol=1e-4)


def test_every_config_choice_builds():
    for name in INIT_METHODS:
        build_init(name, STD, LAYERS, HIDDEN)(torch.empty(8, 8))
