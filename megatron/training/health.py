"""Stop a diverged run: a NaN/inf training loss ends training with one message, and the state
that produced it is never checkpointed (the last checkpoint saved before stays what `latest` names).

The loss checked is the one every rank agrees on (the data-parallel mean), so all ranks stop at
the same step. A step's loss is computed before its update, so an update that breaks the weights
(weight-decay: .inf) shows in the loss only one step later: a save therefore checks the weights
themselves first (all ranks agree through an all-reduce, as a save is collective).
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable

import torch

from megatron.device import collective_device
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
        flag = flag.to(collective_device())
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
    return bool(flag.item())


class LossWatch:
    """Counts consecutive non-finite losses; `healthy` says whether the current state may be saved.
    `resumed_from`: (step directory, iteration) this run resumed from, if it did."""

    def __init__(self, tolerated: int, resumed_from: tuple[str, int] | None = None):
        self.tolerated = tolerated
        self.consecutive = 0
        self.resumed_from = resumed_from

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
                f"step(s) in a row (max-nonfinite-loss-steps: {self.tolerated}); "
                f"{_causes_and_kept(iteration, last_good, self.resumed_from)}; to tolerate isolated spikes raise "
                "max-nonfinite-loss-steps")


def broken_weights(iteration: int, last_good: str | None,
                   resumed_from: tuple[str, int] | None = None) -> NonFiniteWeights:
    return NonFiniteWeights(
        f"training stopped at iteration {iteration}: the weights hold NaN/inf after this step's update "
        f"(its loss, computed before the update, was still finite), so it was not saved; "
        f"{_causes_and_kept(iteration, last_good, resumed_from)}")


def _causes_and_kept(iteration: int, last_good: str | None, resumed_from: tuple[str, int] | None) -> str:
    """The likely causes and what `latest` names. A checkpoint saved by this run held finite weights
    and followed finite losses: good as far as anyone knows. The one this run resumed from, with
    nothing saved since, is not: its state (a damaged optimizer file of a step saved before
    checkpoints carried a manifest) is the first suspect, never "the last good checkpoint"."""
    if not last_good:
        return f"likely causes: {LIKELY_CAUSES}; no checkpoint was saved from this run"
    if resumed_from and os.path.realpath(resumed_from[0]) == os.path.realpath(last_good):
        steps = iteration - resumed_from[1]
        return (f"likely causes: the checkpoint this run resumed from, {last_good}, {steps} step(s) earlier (a damaged "
                f"file, or a state already diverging), then {LIKELY_CAUSES}; `latest` still names that checkpoint "
                "(nothing was saved after it), which is not known to be good: resume from an earlier step "
                "(`iteration: N`) if it fails again")
    return (f"likely causes: {LIKELY_CAUSES}; the last checkpoint saved before the loss went non-finite, {last_good}, "
            "was kept (nothing was saved after): fix the cause and resume from it")
