"""The words of a non-finite-loss stop (megatron/training/health.py): the checkpoint a run resumed
from, with nothing saved since, is the first suspect and never "the last good checkpoint"."""
import math

import pytest

from megatron.training.health import LossWatch, NonFiniteLoss, broken_weights


def _stop(watch: LossWatch, iteration: int, latest: str) -> str:
    with pytest.raises(NonFiniteLoss) as err:
        watch.update(iteration, math.nan, lambda: latest)
    return str(err.value)


def test_a_checkpoint_resumed_from_is_not_called_good():
    msg = _stop(LossWatch(0, ("ck/global_step40", 40)), 41, "ck/global_step40")
    assert "last good" not in msg
    assert msg.index("the checkpoint this run resumed from, ck/global_step40, 1 step(s) earlier") < msg.index("learning rate")
    assert "`latest` still names that checkpoint (nothing was saved after it), which is not known to be good" in msg
    assert "not known to be good" in str(broken_weights(41, "ck/global_step40", ("ck/global_step40", 40)))
    # a step this run saved itself, after finite losses and with finite weights
    msg = _stop(LossWatch(0, ("ck/global_step40", 40)), 45, "ck/global_step44")
    assert msg.index("learning rate") < msg.index("the last checkpoint saved before the loss went non-finite, "
                                                  "ck/global_step44, was kept")
    assert "resumed" not in msg
