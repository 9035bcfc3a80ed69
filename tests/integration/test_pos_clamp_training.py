"""pos-clamp through the trainer: a KERPLE parameter stored below its floor stays there under the
straight-through default (the raw stats in metrics.jsonl show it, the paper's clamped stats do
not), and pos-clamp: projected brings it back and keeps it in the domain after every step, in
fp32, under bf16 and under ZeRO (DeepSpeed's fp32 master copy included: without it, the
clamped model copy would be overwritten from the unclamped master after every step)."""
import os

import pytest
import torch

from megatron.config import load_config
from megatron.positional.kerple_log import EPS
from megatron.process.metrics_file import read_metrics
from megatron.training.projection import _unfused_master
from tests.conftest import train_config_dict, write_yaml

FLOOR32 = float(torch.tensor(EPS))  # the floor as a float32 parameter holds it
SETUPS = {
    "fp32": {},
    "bf16": {"fp16": {"enabled": True, "type": "bfloat16"}},  # DeepSpeed's unfused optimizer
    "zero1": {"zero_optimization": {"stage": 1}},
    "zero3": {"zero_optimization": {"stage": 3}},
}


def master_of(trainer, p):
    """DeepSpeed's fp32 master copy of p, or None when the optimizer updates p itself."""
    from deepspeed.utils import safe_get_full_fp32_param

    found = safe_get_full_fp32_param(p)
    return found if found is not None else _unfused_master(trainer.engine.optimizer, p)


def model_copy(p):
    import deepspeed

    if hasattr(p, "ds_id"):
        with deepspeed.zero.GatheredParameters([p]):
            return p.detach().clone()
    return p.detach().clone()


def train_from_below_the_floor(tmp_path, prefix, name, **over):
    """Train 3 steps from bias_a = -0.5 on every head (model copy and fp32 master copy);
    returns (trainer, metrics.jsonl train rows)."""
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param, safe_set_full_fp32_param

    from megatron.training.trainer import Trainer

    data = train_config_dict(tmp_path / name, prefix, train_iters=3, **over)
    trainer = Trainer(load_config([write_yaml(tmp_path / f"{name}.yml", data)]))
    p = trainer.model.position.bias_a
    with torch.no_grad():
        if safe_get_full_fp32_param(p) is not None:
            safe_set_full_fp32_param(p, torch.full(p.ds_shape if hasattr(p, "ds_id") else p.shape, -0.5))
        elif _unfused_master(trainer.engine.optimizer, p) is not None:
            _unfused_master(trainer.engine.optimizer, p).fill_(-0.5)
        with deepspeed.zero.GatheredParameters([p], modifier_rank=0, enabled=hasattr(p, "ds_id")):
            p.data.fill_(-0.5)
    trainer.train()
    rows = [r for r in read_metrics(os.path.join(trainer.run_dir, "metrics.jsonl")) if r["kind"] == "train"]
    assert len(rows) == 3
    return trainer, rows


def test_straight_through_keeps_the_raw_value_and_logs_it(tmp_path, token_dataset):
    trainer, rows = train_from_below_the_floor(tmp_path, token_dataset, "st")
    for r in rows:
        assert r["bias_a_min"] == pytest.approx(EPS, rel=1e-5) and r["bias_a_max"] == pytest.approx(EPS, rel=1e-5)
        assert -0.6 < r["bias_a_raw_min"] <= r["bias_a_raw_max"] < 0  # Adam moves it ~lr per step
        assert {"bias_p_raw_mean", "bias_p_raw_std", "bias_p_raw_min", "bias_p_raw_max"} <= set(r)
    assert trainer.model.position.bias_a.max() < 0


@pytest.mark.parametrize("setup", list(SETUPS))
def test_projected_keeps_the_stored_value_in_the_domain(tmp_path, token_dataset, setup):
    trainer, rows = train_from_below_the_floor(tmp_path, token_dataset, setup, pos_clamp="projected", **SETUPS[setup])
    for r in rows:
        assert r["bias_a_raw_min"] >= FLOOR32 and r["bias_p_raw_min"] >= FLOOR32
    p = trainer.model.position.bias_a
    assert model_copy(p).min().item() >= FLOOR32
    master = master_of(trainer, p)
    assert (master is not None) == (setup != "fp32")
    if master is not None:  # the copy the next step starts from
        assert master.dtype == torch.float32 and master.min().item() >= FLOOR32
