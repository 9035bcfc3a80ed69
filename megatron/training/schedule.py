"""NeoX's AnnealingLR exactly as the KERPLE paper's code computed it (GPT-NeoX 2022,
megatron/learning_rates.py, inherited from Megatron-LM), stepped once per optimizer step.

With t = optimizer steps taken, T = lr-decay-iters (default train-iters), W = warmup * T (a
float, not rounded) and n = min(t, T - W):

    warmup (W > 0 and t <= W):  lr * n / W                   (0 at t = 0; not floored at min_lr)
    then n -= W, and
        constant:     lr
        linear:       lr * (T - n) / T
        cosine:       lr / 2 * (cos(pi * n / T) + 1)
        exponential:  lr * exp(-0.693 * n / T)
    floored at min_lr.

The quirks are kept on purpose (the paper's schedule, so its sum of learning rates, depends on
them): the decay divides by T, not by the decay span T - W; n stops at T - 2W, so the LR stops
moving W steps before T and cosine never reaches 0 by itself (min_lr is a floor, not the end of
the curve); linear ends at lr * 2W / T; and with warmup > 0.5 the ramp stops at lr * (T - W) / W.
DeepSpeed steps the scheduler after each optimizer step, so optimizer step s uses lr(t = s): the
first step of a run with warmup uses lr 0 (as NeoX).
"""
from __future__ import annotations

import math


class AnnealingLR:
    def __init__(self, optimizer, start_lr: float, warmup_iter: float, total_iters: int,
                 decay_style: str, min_lr: float = 0.0, override_lr_scheduler: bool = False,
                 use_checkpoint_lr_scheduler: bool = False):
        self.optimizer = optimizer
        self.start_lr = start_lr
        self.warmup_iter = warmup_iter
        self.end_iter = max(total_iters, 1)
        self.decay_style = decay_style
        self.min_lr = min_lr
        self.num_iters = 0
        self.override_lr_scheduler = override_lr_scheduler
        self.use_checkpoint_lr_scheduler = use_checkpoint_lr_scheduler
        self.step(0)

    def get_lr(self) -> float:
        n = min(self.num_iters, self.end_iter - self.warmup_iter)
        if self.warmup_iter > 0 and self.num_iters <= self.warmup_iter:
            return float(self.start_lr) * n / self.warmup_iter
        n -= self.warmup_iter
        if self.decay_style == "linear":
            lr = self.start_lr * (self.end_iter - n) / self.end_iter
        elif self.decay_style == "cosine":
            lr = self.start_lr / 2.0 * (math.cos(math.pi * n / self.end_iter) + 1)
        elif self.decay_style == "exponential":
            lr = self.start_lr * math.exp(-0.693 * n / self.end_iter)  # exp(-0.693) = 1/2
        else:  # constant
            lr = self.start_lr
        return max(lr, self.min_lr)

    def step(self, step_num: int | None = None) -> None:
        self.num_iters = self.num_iters + 1 if step_num is None else step_num
        lr = self.get_lr()
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def get_last_lr(self) -> list[float]:
        return [g["lr"] for g in self.optimizer.param_groups]

    def state_dict(self) -> dict:
        return {
            "start_lr": self.start_lr,
            "warmup_iter": self.warmup_iter,
            "num_iters": self.num_iters,
            "decay_style": self.decay_style,
            "end_iter": self.end_iter,
            "min_lr": self.min_lr,
        }

    def load_state_dict(self, sd: dict) -> None:
        # NeoX: override_lr_scheduler keeps this run's settings; use_checkpoint_lr_scheduler
        # takes the checkpoint's; by default the checkpoint's position is kept with our settings.
        if self.use_checkpoint_lr_scheduler and not self.override_lr_scheduler:
            self.start_lr = sd["start_lr"]
            self.warmup_iter = sd["warmup_iter"]
            self.end_iter = sd["end_iter"]
            self.decay_style = sd["decay_style"]
            self.min_lr = sd["min_lr"]
        self.step(sd["num_iters"])


def decay_iters(cfg) -> int:
    """T: lr-decay-iters, else lr-decay-fraction * train-iters, else train-iters; at least 1."""
    ocfg = cfg.optimizer
    total = ocfg.lr_decay_iters
    if total is None and ocfg.lr_decay_fraction is not None:
        total = int(ocfg.lr_decay_fraction * cfg.training.train_iters)
    if total is None:
        total = cfg.training.train_iters
    return max(1, total)


def build_scheduler(cfg, optimizer) -> AnnealingLR:
    ocfg = cfg.optimizer
    total = decay_iters(cfg)
    return AnnealingLR(
        optimizer,
        start_lr=ocfg.lr,
        warmup_iter=ocfg.warmup * total,  # NeoX keeps the fraction's float (e.g. 0.05 * 30 = 1.5)
        total_iters=total,
        decay_style=ocfg.lr_decay_style,
        min_lr=ocfg.min_lr,
        override_lr_scheduler=ocfg.override_lr_scheduler,
        use_checkpoint_lr_scheduler=ocfg.use_checkpoint_lr_scheduler,
    )
