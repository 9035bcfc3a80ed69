"""DeepSpeed's own sections, forwarded as given, and the DeepSpeed JSON built from a NeoXConfig.

No "optimizer"/"scheduler" sections: our code builds both and hands them to deepspeed.initialize
(a client optimizer takes precedence anyway, as in NeoX).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

from megatron.config.fields import key
from megatron.config.precision import section_for_deepspeed


@dataclass(frozen=True)
class DeepSpeedConfig:
    flops_profiler: dict | None = key(None, "DeepSpeed flops_profiler section, forwarded as is.")
    activation_checkpointing: dict | None = key(
        None, "DeepSpeed activation_checkpointing section, forwarded as is.")
    comms_logger: dict | None = key(None, "DeepSpeed comms_logger section, forwarded as is.")
    autotuning: dict | None = key(None, "DeepSpeed autotuning section, forwarded as is.")
    deepspeed_extra_args: dict | None = key(
        None, "Extra top-level DeepSpeed JSON entries, merged last (they win).")

    def check(self) -> list[tuple[str, str]]:
        return []


_FP16_DEFAULTS = {"loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1,
                  "initial_scale_power": 16}


def _fp16_section(fp16: dict | None) -> dict:
    """fp16 without the 2022 `type` key; loss_scale 0 (or null) = dynamic loss scaling."""
    src = section_for_deepspeed("fp16", fp16)
    out = {"enabled": True, "loss_scale": src.pop("loss_scale", 0) or 0}
    out.update({k: src.pop(k, v) for k, v in _FP16_DEFAULTS.items()})
    out.update({k: v for k, v in src.items() if k != "enabled"})
    return out


def deepspeed_config(cfg, dp_world_size: int) -> dict:
    train, micro, gas = cfg.training.batch_sizes(dp_world_size)
    ds = {
        "train_batch_size": train,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": cfg.optimizer.gradient_clipping,
        "zero_optimization": copy.deepcopy(cfg.optimizer.zero_optimization),
        "zero_allow_untested_optimizer": cfg.optimizer.zero_allow_untested_optimizer,
        "steps_per_print": cfg.logging.steps_per_print,
        "wall_clock_breakdown": cfg.logging.wall_clock_breakdown,
    }
    dtype = cfg.precision.dtype
    if dtype == "bf16":
        ds["bf16"] = {**section_for_deepspeed("bf16", cfg.precision.bf16), "enabled": True}
    elif dtype == "fp16":
        ds["fp16"] = _fp16_section(cfg.precision.fp16)
    if cfg.precision.fp32_allreduce and dtype != "fp32":
        # NeoX/DeeperSpeed's fp32_allreduce: reduce 16-bit gradients in fp32 across ranks.
        ds["communication_data_type"] = "fp32"
    passthrough = cfg.deepspeed
    for name in ("flops_profiler", "activation_checkpointing", "comms_logger", "autotuning"):
        if getattr(passthrough, name) is not None:
            ds[name] = copy.deepcopy(getattr(passthrough, name))
    ds.update(copy.deepcopy(passthrough.deepspeed_extra_args or {}))
    return ds
