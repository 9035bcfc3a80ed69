"""A non-finite loss stops training with one clear error, and the bad state is never saved: the
last good checkpoint stays what `latest` names (not at a save interval, not at the end)."""
import math
import os

import pytest
import torch

from megatron.checkpoint.tags import read_latest
from megatron.config import load_config
from megatron.errors import handle
from tests.conftest import train_config_dict, write_yaml


def poisoned_trainer(tmp_path, prefix, poison_from: int, **over):
    """A Trainer whose weights turn NaN before step `poison_from` (what a diverging run does)."""
    from megatron.training.trainer import Trainer

    cfg = load_config([write_yaml(tmp_path / "nan.yml", train_config_dict(tmp_path, prefix, **over))])
    trainer = Trainer(cfg)
    real = trainer.forward_backward

    def forward_backward(batch):
        if trainer.iteration + 1 >= poison_from:
            with torch.no_grad():
                next(trainer.model.parameters()).fill_(math.nan)
        return real(batch)

    trainer.forward_backward = forward_backward
    return trainer


@pytest.mark.parametrize("tolerated", [0, 1])
def test_nonfinite_loss_stops_without_saving_the_bad_state(tmp_path, token_dataset, capsys, tolerated):
    from megatron.training.health import NonFiniteLoss

    ck = str(tmp_path / "ck")
    trainer = poisoned_trainer(tmp_path, token_dataset, poison_from=3, train_iters=8, save=ck,
                               save_interval=2, max_nonfinite_loss_steps=tolerated)
    with pytest.raises(NonFiniteLoss) as err:
        trainer.train()
    stop = 3 + tolerated
    message = str(err.value)
    assert f"iteration {stop}" in message and "max-nonfinite-loss-steps" in message
    assert "learning rate" in message and os.path.join(ck, "global_step2") in message
    assert read_latest(ck) == "global_step2"  # step 4 (a save interval) held NaN weights
    assert sorted(os.listdir(ck)) == ["global_step2", "latest"]
    assert handle("train.py", err.value) != 0
    assert "Traceback" not in capsys.readouterr().err


def test_weights_broken_by_the_last_update_are_not_saved(tmp_path, token_dataset):
    """weight-decay: .inf: the loss of a step is computed before its update, so it is still finite
    when the update has already made the weights NaN; the save must check the weights themselves."""
    from megatron.training.health import Diverged
    from megatron.training.trainer import Trainer

    ck = str(tmp_path / "ck")
    data = train_config_dict(tmp_path, token_dataset, train_iters=4, save=ck, save_interval=1)
    trainer = Trainer(load_config([write_yaml(tmp_path / "w.yml", data)]))
    real = trainer.forward_backward

    def forward_backward(batch):
        loss = real(batch)
        if trainer.iteration + 1 == 2:  # after the update of step 2
            with torch.no_grad():
                next(trainer.model.parameters()).fill_(math.inf)
        return loss

    trainer.forward_backward = forward_backward
    with pytest.raises(Diverged, match="iteration 2: the weights hold NaN/inf") as err:
        trainer.train()
    assert os.path.join(ck, "global_step1") in str(err.value)
    assert read_latest(ck) == "global_step1" and sorted(os.listdir(ck)) == ["global_step1", "latest"]
