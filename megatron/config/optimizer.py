"""Optimizer, LR schedule, gradient clipping and ZeRO (NeoX keys; the optimizer and scheduler are
built by our code from these, not by DeepSpeed)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from megatron.config.fields import key
from megatron.config.nested import optimizer_key_problems, zero_key_problems

OPTIMIZER_TYPES = ("adam", "adamw", "sgd")


@dataclass(frozen=True)
class OptimizerConfig:
    optimizer: dict = key(
        {"type": "Adam", "params": {"lr": 6e-4, "betas": [0.9, 0.999], "eps": 1e-8}},
        "Optimizer as NeoX writes it: {type: Adam|AdamW|SGD (any case), params: {lr, betas, eps, "
        "momentum}}.")
    weight_decay: float = key(0.1, "Decoupled weight decay (norms and biases get none).", ge=0)
    gradient_clipping: float = key(
        1.0, "Clip the global gradient norm to this; 0 = no clipping. `clip_grad` is an alias.", ge=0)
    lr_decay_style: str = key(
        "linear", "LR decay after warmup, as the KERPLE paper's NeoX computed it (quirks included: "
        "the decay divides by lr-decay-iters, not by the decay span, and stops warmup steps before "
        "it; see megatron/training/schedule.py).",
        choices=("constant", "linear", "cosine", "exponential"))
    lr_decay_iters: int | None = key(
        None, "Iterations the LR decays over; null = lr-decay-fraction * train-iters, else "
        "train-iters.", ge=1)
    lr_decay_fraction: float | None = key(
        None, "lr-decay-iters as a fraction of train-iters (used when lr-decay-iters is null).",
        gt=0, le=1)
    min_lr: float = key(0.0, "Floor of the decayed LR (the decay curve is not rescaled to end on it).",
                        ge=0)
    warmup: float = key(
        0.01, "Linear warmup from 0 as a fraction of lr-decay-iters (not rounded); above 0.5 the "
        "ramp stops short of the peak LR, as in NeoX.", ge=0, le=1)
    override_lr_scheduler: bool = key(
        False, "On load, take the schedule from this config, not from the checkpoint.")
    use_checkpoint_lr_scheduler: bool = key(
        False, "On load, take the schedule from the checkpoint, not from this config.")
    zero_optimization: dict = key(
        {"stage": 0}, "DeepSpeed ZeRO section, forwarded as is; stage in 0..3.")
    zero_allow_untested_optimizer: bool = key(
        True, "Let ZeRO wrap our own (client) optimizer.")

    @property
    def type(self) -> str:
        return str(self.optimizer.get("type", "adam")).lower()

    @property
    def _params(self) -> dict:
        return self.optimizer.get("params") or {}

    @property
    def lr(self) -> float:
        return float(self._params.get("lr", 6e-4))

    @property
    def betas(self) -> tuple[float, float]:
        b = self._params.get("betas", [0.9, 0.999])
        return float(b[0]), float(b[1])

    @property
    def eps(self) -> float:
        return float(self._params.get("eps", 1e-8))

    @property
    def momentum(self) -> float:
        return float(self._params.get("momentum", 0.0))

    def check(self) -> list[tuple[str, str]]:
        # unknown nested keys first and all of them: a typo'd `lrr` is the cause of "lr ... got None"
        out = [("optimizer", m) for m in optimizer_key_problems(self.optimizer)]
        out += [("zero_optimization", m) for m in zero_key_problems(self.zero_optimization)]
        out += [("optimizer", m) for m in _optimizer_problems(self.optimizer)
                if not (m.startswith("params.lr ") and "lr" not in (self.optimizer.get("params") or {})
                        and any("optimizer.params." in p for _, p in out))]
        stage = self.zero_optimization.get("stage", 0)
        if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
            out.append(("zero_optimization", f"stage must be 0, 1, 2 or 3, got {stage!r}"))
        if self.lr_decay_iters is not None and self.lr_decay_fraction is not None:
            out.append(("lr_decay_fraction", "set lr-decay-iters or lr-decay-fraction, not both"))
        if not out and self.min_lr > self.lr:
            out.append(("min_lr", f"must be <= the optimizer lr ({self.lr})"))
        if self.override_lr_scheduler and self.use_checkpoint_lr_scheduler:
            out.append(("use_checkpoint_lr_scheduler", "conflicts with override-lr-scheduler: true"))
        return out


def _num(x) -> float | None:
    """A number, also from a string: YAML 1.1 reads `6e-4` (no dot) as a string."""
    if isinstance(x, bool):
        return None
    try:
        value = float(x)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None  # 'nan'/'inf' strings are no numbers here


def _optimizer_problems(opt: dict) -> list[str]:
    t = opt.get("type")
    if not isinstance(t, str) or t.lower() not in OPTIMIZER_TYPES:
        return [f"type must be one of Adam, AdamW, SGD (any case), got {t!r}"]
    params = opt.get("params", {})
    if not isinstance(params, dict):
        return [f"params must be a mapping, got {params!r}"]
    out = []
    lr = params.get("lr")
    if _num(lr) is None or _num(lr) <= 0:
        out.append(f"params.lr must be a number > 0, got {lr!r}")
    betas = params.get("betas", [0.9, 0.999])
    if not (isinstance(betas, (list, tuple)) and len(betas) == 2
            and all(_num(b) is not None and 0 <= _num(b) < 1 for b in betas)):
        out.append(f"params.betas must be a pair of numbers in [0, 1), got {betas!r}")
    eps = params.get("eps", 1e-8)
    if _num(eps) is None or _num(eps) <= 0:
        out.append(f"params.eps must be a number > 0, got {eps!r}")
    return out
