"""AnnealingLR against NeoX's closed forms."""
import math

import pytest
import torch

from megatron.training.schedule import AnnealingLR


def sched(style, warmup=10, total=100, lr=1.0, min_lr=0.1):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    return AnnealingLR(opt, lr, warmup, total, style, min_lr)


@pytest.mark.parametrize("style", ["constant", "linear", "cosine", "exponential"])
def test_warmup_is_linear(style):
    s = sched(style)
    for t in range(0, 11):
        s.step(t)
        assert s.get_last_lr()[0] == pytest.approx(1.0 * max(t, 1) / 10)


def test_decay_closed_forms():
    for t in (10, 30, 55, 100, 150):
        td = min(t - 10, 90)
        expect = {
            "linear": max(1.0 * (90 - td) / 90, 0.1),
            "cosine": max(0.1 + 0.9 / 2 * (1 + math.cos(math.pi * td / 90)), 0.1),
            "exponential": max(math.exp(-0.693 * td / 90), 0.1),
            "constant": 1.0,
        }
        for style, value in expect.items():
            s = sched(style)
            s.step(t)
            assert s.get_last_lr()[0] == pytest.approx(value), (style, t)


def test_state_dict_round_trip_keeps_position():
    a = sched("cosine")
    for _ in range(37):
        a.step()
    b = sched("cosine")
    b.load_state_dict(a.state_dict())
    assert b.num_iters == 37 and b.get_last_lr() == a.get_last_lr()
