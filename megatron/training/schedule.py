"""NeoX's AnnealingLR (megatron/learning_rates.py semantics), stepped once per optimizer step.

    warmup (t <= W):  lr * max(t, 1) / W   (not floored at min_lr, as NeoX)
    constant:         lr
    linear:           lr * (T - t) / (T - W)
    cosine:           min + (lr - min) / 2 * (1 + cos(pi * (t - W) / (T - W)))
    exponential:      lr * exp(-0.693 * (t - W) / (T - W))
and never below min_lr. t counts optimizer steps; T = lr_decay_iters; W = warmup * T.
"""
from __future__ import annotations

import math


class AnnealingLR:
    def __init__(self, optimizer, start_lr: float, warmup_iter: int, total_iters: int,
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
        t = self.num_iters
        if self.warmup_iter > 0 and t <= self.warmup_iter:
            return self.start_lr * max(t, 1) / self.warmup_iter
        t_dec = min(t - self.warmup_iter, self.end_iter - self.warmup_iter)
        span = max(self.end_iter - self.warmup_iter, 1)
        if self.decay_style == "linear":
            lr = self.start_lr * (span - t_dec) / span
        elif self.decay_style == "cosine":
            lr = self.min_lr + (self.start_lr - self.min_lr) / 2.0 * (1 + math.cos(math.pi * t_dec / span))
        elif self.decay_style == "exponential":
            lr = self.start_lr * math.exp(-0.693 * t_dec / span)
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


def build_scheduler(cfg, optimizer) -> AnnealingLR:
    ocfg = cfg.optimizer
    total = ocfg.lr_decay_iters
    if total is None and ocfg.lr_decay_fraction is not None:
        total = int(ocfg.lr_decay_fraction * cfg.training.train_iters)
    if total is None:
        total = cfg.training.train_iters
    return AnnealingLR(
        optimizer,
        start_lr=ocfg.lr,
        warmup_iter=int(ocfg.warmup * total),
        total_iters=total,
        decay_style=ocfg.lr_decay_style,
        min_lr=ocfg.min_lr,
        override_lr_scheduler=ocfg.override_lr_scheduler,
        use_checkpoint_lr_scheduler=ocfg.use_checkpoint_lr_scheduler,
    )
