"""Stop a diverged run: a NaN/inf training loss ends training with one message, and the state
that produced it is never checkpointed (the last good checkpoint stays what `latest` names).

The loss checked is the one every rank agrees on (the data-parallel mean), so all ranks stop at
the same step.
"""
from __future__ import annotations

import math
from collections.abc import Callable

from megatron.errors import UserError

LIKELY_CAUSES = ("a learning rate too high for this model (lower `lr` or lengthen `warmup`), "
                 "huge or inf optimizer values (weight-decay, betas, eps), fp16 overflow (use bf16), "
                 "or corrupt data")


class NonFiniteLoss(UserError):
    """Training produced a NaN/inf loss more often in a row than `max-nonfinite-loss-steps` allows."""


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
        kept = (f"the last good checkpoint {last_good} was kept (nothing was saved after the loss "
                "went non-finite): fix the cause and resume from it" if last_good
                else "no checkpoint was saved from this run")
        return (f"training stopped at iteration {iteration}: the loss was {loss} for {self.consecutive} "
                f"step(s) in a row (max-nonfinite-loss-steps: {self.tolerated}); likely causes: "
                f"{LIKELY_CAUSES}; {kept}; to tolerate isolated spikes raise max-nonfinite-loss-steps")
