"""Stop a diverged run: a NaN/inf training loss ends training with one message, and the state
that produced it is never checkpointed (the last good checkpoint stays what `latest` names).

The loss checked is the one every rank agrees on (the data-parallel mean), so all ranks stop at
the same step. A step's loss is computed before its update, so an update that breaks the weights
(weight-decay: .inf) shows in the loss only one step later: a save therefore checks the weights
themselves first (all ranks agree through an all-reduce, as a save is collective).
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch

from megatron.errors import UserError

LIKELY_CAUSES = ("a learning rate too high for this model (lower `lr` or lengthen `warmup`), "
                 "huge or inf optimizer values (weight-decay, betas, eps), fp16 overflow (use bf16), "
                 "or corrupt data")


class Diverged(UserError):
    """Training produced NaN/inf values: the loss or the weights."""


class NonFiniteLoss(Diverged):
    """A NaN/inf loss more often in a row than `max-nonfinite-loss-steps` allows."""


class NonFiniteWeights(Diverged):
    """The weights hold NaN/inf when a checkpoint is due."""


def weights_finite(model: torch.nn.Module) -> bool:
    """True when every rank's parameters (ZeRO-3: its partitions) are finite. Collective."""
    ok = all(bool(torch.isfinite(getattr(p, "ds_tensor", p)).all()) for p in model.parameters())
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        from megatron.device import collective_device

        flag = flag.to(collective_device())
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
    return bool(flag.item())


class LossWatch:
    """Counts consecutive non-finite losses; `healthy` says whether the current state may be saved."""

    def __init__(self, tolerated: int):
        self.tolerated = tolerated
        self.consecutive = 0

    @property
    def healthy(self) -> bool:
        return self.consecutive == 0

    def update(self, iteration: int, loss: float, last_good: Callable[[], str | None]) -> None:
        """Record the loss of `iteration`; raise NonFiniteLoss when too many in a row were NaN/inf.
        last_good() names the checkpoint a resume would start from (None: none saved); it is only
        asked when training stops."""
        if math.isfinite(loss):
            self.consecutive = 0
            return
        self.consecutive += 1
        if self.consecutive > self.tolerated:
            raise NonFiniteLoss(self.message(iteration, loss, last_good()))

    def check_end(self, iteration: int, loss: float, last_good: Callable[[], str | None]) -> None:
        """Training ended (all iterations, exit-interval, signal) on a tolerated non-finite loss:
        that is still a failed run."""
        if not self.healthy:
            raise NonFiniteLoss(self.message(iteration, loss, last_good()))

    def message(self, iteration: int, loss: float, last_good: str | None) -> str:
        return (f"training stopped at iteration {iteration}: the loss was {loss} for {self.consecutive} "
                f"step(s) in a row (max-nonfinite-loss-steps: {self.tolerated}); likely causes: "
                f"{LIKELY_CAUSES}; {_kept(last_good)}; to tolerate isolated spikes raise max-nonfinite-loss-steps")


def broken_weights(iteration: int, last_good: str | None) -> NonFiniteWeights:
    return NonFiniteWeights(
        f"training stopped at iteration {iteration}: the weights hold NaN/inf after this step's update "
        f"(its loss, computed before the update, was still finite), so it was not saved; likely causes: "
        f"{LIKELY_CAUSES}; {_kept(last_good)}")


def _kept(last_good: str | None) -> str:
    if not last_good:
        return "no checkpoint was saved from this run"
    return (f"the last good checkpoint {last_good} was kept (nothing was saved after training went "
            "non-finite): fix the cause and resume from it")
