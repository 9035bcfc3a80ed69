"""Positional parameter domains: the raw (stored) values are logged beside the clamped ones, and
pos-clamp: projected keeps the stored values inside the domain after a step that pushes them out,
where the straight-through default lets them leave it."""
import pytest
import torch

from megatron.config.errors import ConfigError
from megatron.model import GPTModel
from megatron.positional.kerple_log import EPS
from megatron.training.projection import project_positional


def kerple(tiny_config, pos_emb="kerple_log", **over):
    torch.manual_seed(0)
    return GPTModel(tiny_config(pos_emb=pos_emb, **over).model, 128).position


def push_down_one_step(scheme):
    """One SGD step (lr 1) on the sum of the clamped values: the straight-through gradient is 1 for
    every head, so each stored value drops by exactly 1, far below the floor."""
    before = {name: p.detach().clone() for name, p in scheme.named_parameters()}
    opt = torch.optim.SGD(scheme.parameters(), lr=1.0)
    sum(v.sum() for v in scheme.clamped().values()).backward()
    opt.step()
    return before


def test_raw_stats_show_what_the_clamped_stats_hide(tiny_config):
    s = kerple(tiny_config)
    with torch.no_grad():
        s.bias_a.copy_(torch.tensor([-0.5, 0.3, 0.005, 0.7])[:, None, None])
    clamped, raw = s.stats(), s.raw_stats()
    assert clamped["bias_a_min"] == pytest.approx(EPS)  # the paper's key: the floor
    assert raw["bias_a_raw_min"] == pytest.approx(-0.5) and raw["bias_a_raw_max"] == pytest.approx(0.7)
    assert raw["bias_a_raw_mean"] == pytest.approx((-0.5 + 0.3 + 0.005 + 0.7) / 4)
    assert set(raw) == {f"{n}_raw_{k}" for n in ("bias_p", "bias_a") for k in ("mean", "std", "max", "min")}


def test_straight_through_lets_the_stored_value_leave_the_domain(tiny_config):
    s = kerple(tiny_config)
    before = push_down_one_step(s)
    torch.testing.assert_close(s.bias_a.detach(), before["bias_a"] - 1.0)
    assert s.raw_stats()["bias_a_raw_max"] < EPS  # every head is now below the floor ...
    assert s.stats()["bias_a_min"] == pytest.approx(EPS)  # ... which the clamped stats do not show


@pytest.mark.parametrize("pos_emb,domains", [
    ("kerple_log", {"bias_p": (EPS, None), "bias_a": (EPS, None)}),
    ("kerple_power_ap_ap", {"bias_p": (EPS, 2.0), "bias_a": (EPS, None), "wei_p": (EPS, 2.0), "wei_a": (EPS, None)}),
])
def test_projected_keeps_every_stored_value_in_its_domain(tiny_config, pos_emb, domains):
    s = kerple(tiny_config, pos_emb)
    before = push_down_one_step(s)
    project_positional(s)
    for name, (lo, hi) in domains.items():
        stored, pushed = getattr(s, name).detach(), before[name] - 1.0
        torch.testing.assert_close(stored, pushed.clamp(min=lo, max=hi))  # values inside stay as they are
        floor32 = float(torch.tensor(lo))  # the floor as a float32 parameter holds it
        assert stored.min() >= floor32 and s.raw_stats()[f"{name}_raw_min"] >= floor32
    # and from above: an exponent pushed past its maximum comes back to it
    if "wei_p" in domains:
        with torch.no_grad():
            s.wei_p.fill_(5.0)
        project_positional(s)
        assert torch.all(s.wei_p == 2.0)


def test_projected_leaves_frozen_and_unbounded_parameters_alone(tiny_config):
    original = kerple(tiny_config, "kerple_power_original")  # frozen ALiBi slopes, some below 1e-2
    slopes = original.bias_a.detach().clone()
    project_positional(original)
    assert torch.equal(original.bias_a, slopes) and slopes.min() < EPS
    project_positional(kerple(tiny_config, "rotary"))  # no domain: nothing to do


def test_pos_clamp_values(tiny_config):
    assert tiny_config().model.pos_clamp == "straight-through"
    assert tiny_config(pos_clamp="projected").model.pos_clamp == "projected"
    with pytest.raises(ConfigError) as e:
        tiny_config(pos_clamp="project")
    assert "pos-clamp" in str(e.value) and "straight-through" in str(e.value) and "projected" in str(e.value)
    with pytest.raises(ConfigError) as e:
        tiny_config(pos_clamp="projected", precision="fp16")
    assert "pos-clamp" in str(e.value) and "use bf16" in str(e.value)
    assert tiny_config(pos_clamp="projected", precision="fp16", zero_optimization={"stage": 1})
