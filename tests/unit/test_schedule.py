"""AnnealingLR against the KERPLE paper's code (GPT-NeoX 2022 megatron/learning_rates.py).

The expected values come from the formula as the paper's code states it, restated here:
n = min(t, T - W); warmup (W > 0 and t <= W): lr * n / W; then n -= W and
linear lr * (T - n) / T, cosine lr / 2 * (cos(pi * n / T) + 1), exponential
lr * exp(-0.693 * n / T), constant lr; floored at min_lr. T = lr-decay-iters (default
train-iters), W = warmup * T as a float."""
import math

import pytest
import torch

from megatron.config.neox import load_config
from megatron.training.schedule import AnnealingLR, build_scheduler


def neox_lr(style, t, lr, warmup_iter, end_iter, min_lr):
    n = min(t, end_iter - warmup_iter)
    if warmup_iter > 0 and t <= warmup_iter:
        return lr * n / warmup_iter
    n -= warmup_iter
    if style == "linear":
        value = lr * (end_iter - n) / end_iter
    elif style == "cosine":
        value = lr / 2 * (math.cos(math.pi * n / end_iter) + 1)
    elif style == "exponential":
        value = lr * math.exp(-0.693 * n / end_iter)
    else:
        value = lr
    return max(value, min_lr)


def sched(style, warmup=10, total=100, lr=1.0, min_lr=0.1):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    return AnnealingLR(opt, lr, warmup, total, style, min_lr)


def lr_at(s, t):
    s.step(t)
    return s.get_last_lr()[0]


STYLES = ["constant", "linear", "cosine", "exponential"]


@pytest.mark.parametrize("style", STYLES)
def test_warmup_is_linear_from_zero(style):
    s = sched(style)
    assert lr_at(s, 0) == 0.0  # NeoX's first optimizer step runs at lr 0 (no floor in warmup)
    for t in range(1, 11):
        assert lr_at(s, t) == pytest.approx(t / 10)


@pytest.mark.parametrize("style", STYLES)
def test_every_step_matches_the_paper_formula(style):
    s = sched(style, warmup=10, total=100, lr=1.0, min_lr=0.0)
    for t in range(0, 131):
        assert lr_at(s, t) == pytest.approx(neox_lr(style, t, 1.0, 10, 100, 0.0), abs=1e-12), t


def test_quirks_by_hand():
    """A few values worked out by hand, not from the formula above (T=100, W=10, lr 1, no floor)."""
    # t = 55: n = 45; cosine divides by T = 100, not by the decay span 90
    assert lr_at(sched("cosine", min_lr=0.0), 55) == pytest.approx((math.cos(0.45 * math.pi) + 1) / 2)
    # the decay stops at t = T - W = 90 (n = 80); later steps keep that LR
    for t in (90, 100, 500):
        assert lr_at(sched("cosine", min_lr=0.0), t) == pytest.approx((math.cos(0.8 * math.pi) + 1) / 2)
        assert lr_at(sched("linear", min_lr=0.0), t) == pytest.approx(0.2)  # = 2W / T, not 0
        assert lr_at(sched("exponential", min_lr=0.0), t) == pytest.approx(math.exp(-0.693 * 0.8))
    # just past warmup (t = 11, n = 1)
    assert lr_at(sched("linear", min_lr=0.0), 11) == pytest.approx(0.99)


def test_min_lr_is_a_floor_not_the_end_of_the_curve():
    s = sched("cosine", min_lr=0.3)
    # without the floor the cosine at t = 80 (n = 70) is (cos(0.7 pi) + 1) / 2 = 0.206
    assert lr_at(s, 80) == 0.3
    # above the floor the curve is the one without min_lr (it is not rescaled to end on min_lr)
    assert lr_at(s, 40) == pytest.approx((math.cos(0.3 * math.pi) + 1) / 2)


def test_no_warmup_starts_at_peak():
    s = sched("cosine", warmup=0, total=100, min_lr=0.0)
    assert lr_at(s, 0) == 1.0
    assert lr_at(s, 50) == pytest.approx(0.5)


PAPER = ["configs/paper/local_setup.yml", "configs/paper/train.yml"]


def applied_lrs(cfg):
    """The LR each optimizer step uses (DeepSpeed steps the scheduler after the optimizer)."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    s = build_scheduler(cfg, opt)
    out = []
    for _ in range(cfg.training.train_iters):
        out.append(opt.param_groups[0]["lr"])
        s.step()
    return out


def test_paper_config_schedule():
    """configs/paper: lr 6e-4, cosine, T = 50000 (lr-decay-iters), W = 0.01 * T = 500, min_lr 0."""
    cfg = load_config(PAPER)
    lrs = applied_lrs(cfg)
    expect = [neox_lr("cosine", t, 6e-4, 500.0, 50000, 0.0) for t in range(50000)]
    assert lrs[0] == 0.0 and lrs[500] == pytest.approx(6e-4)
    assert lrs[250] == pytest.approx(3e-4)
    assert lrs[49999] == pytest.approx(3e-4 * (math.cos(math.pi * 0.98) + 1))  # frozen since t = 49500
    assert max(abs(a - b) for a, b in zip(lrs, expect)) < 1e-15
    # The paper's sum of learning rates (~15.15) is ~1% above a cosine that lands on 0 at T (15.0).
    assert sum(lrs) == pytest.approx(sum(expect), rel=1e-12)
    assert sum(lrs) == pytest.approx(15.15, abs=0.01)


def test_warmup_iterations_are_not_rounded():
    cfg = load_config(PAPER, {"lr-decay-iters": 30, "train-iters": 30, "warmup": 0.05})
    s = build_scheduler(cfg, torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0))
    assert s.warmup_iter == pytest.approx(1.5)
    assert lr_at(s, 1) == pytest.approx(6e-4 / 1.5)


def test_decay_iters_default_to_train_iters():
    cfg = load_config(PAPER, {"lr-decay-iters": None, "train-iters": 200})
    s = build_scheduler(cfg, torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0))
    assert s.end_iter == 200 and s.warmup_iter == pytest.approx(2.0)


def test_state_dict_round_trip_keeps_position():
    a = sched("cosine")
    for _ in range(37):
        a.step()
    b = sched("cosine")
    b.load_state_dict(a.state_dict())
    assert b.num_iters == 37 and b.get_last_lr() == a.get_last_lr()
