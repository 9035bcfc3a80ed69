"""Precision through DeepSpeed on CPU: bf16 trains (the paper's setting), fp16 is refused clearly,
fp32_allreduce reaches the DeepSpeed config."""
import math

import pytest

from megatron.config import load_config
from tests.conftest import train_config_dict, write_yaml


def make(tmp_path, prefix, **over):
    return load_config([write_yaml(tmp_path / "p.yml", train_config_dict(tmp_path, prefix, **over))])


def test_bf16_trains_through_deepspeed(tmp_path, token_dataset, capsys):

    from megatron.training.trainer import Trainer

    cfg = make(tmp_path, token_dataset, train_iters=3, fp16={"enabled": True, "type": "bfloat16"},
               fp32_allreduce=True)
    ds = cfg.deepspeed_config(1)
    assert ds["bf16"] == {"enabled": True} and "fp16" not in ds and ds["communication_data_type"] == "fp32"
    trainer = Trainer(cfg)
    result = trainer.train()
    assert next(trainer.model.parameters()).dtype.is_floating_point
    assert math.isfinite(result["last"]["lm_loss"]) and math.isfinite(result["validation"]["lm_loss"])
    warned = "bf16 on CPU runs 10-100x slower than fp32" in capsys.readouterr().err
    assert warned == (trainer.dist.device.type == "cpu")  # docs/launching.md's advice for CPUs, said where it matters


def test_fp16_on_cpu_is_refused_with_the_fix(tmp_path, token_dataset):
    from megatron.training.trainer import Trainer

    cfg = make(tmp_path, token_dataset, fp16={"enabled": True})
    assert cfg.deepspeed_config(1)["fp16"]["loss_scale"] == 0  # dynamic loss scaling
    with pytest.raises(ValueError, match="fp16 training needs a GPU.*on CPU train in fp32") as e:
        Trainer(cfg)
    assert "use bf16" not in str(e.value)  # the one answer for CPUs, as docs/launching.md gives it


def test_zero3_checkpoint_evaluates(tmp_path, token_dataset):
    """ZeRO-3 partitions the weights over the optimizer files; evaluation consolidates them."""
    import torch

    from megatron.checkpoint.load_model import load_checkpoint_model
    from megatron.training.trainer import Trainer

    ck = str(tmp_path / "ck")
    trainer = Trainer(make(tmp_path, token_dataset, train_iters=2, zero_optimization={"stage": 3}, save=ck,
                           save_interval=2))
    trainer.train()
    model, cfg, client = load_checkpoint_model(ck)
    assert client["iteration"] == 2
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(trainer.model.parameters())):
        for name, p in trainer.model.named_parameters():
            assert torch.equal(p.detach().float(), model.state_dict()[name].float()), name
    tokens = torch.randint(0, 100, (1, 16))
    assert torch.isfinite(model(tokens, labels=tokens))
