"""DeepSpeed sections we do not interpret, forwarded into the DeepSpeed JSON as given."""
from __future__ import annotations

from dataclasses import dataclass

from megatron.config.fields import key


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
