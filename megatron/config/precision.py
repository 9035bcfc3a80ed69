"""Mixed precision. Three NeoX/DeepSpeed spellings map onto one `dtype`:

- `fp16: {enabled: true, type: bfloat16}` means bf16: the 2022 DeeperSpeed convention the
  KERPLE paper's configs use (current NeoX would silently read it as fp16);
- `bf16: {enabled: true}` means bf16;
- `precision: fp32 | fp16 | bfloat16`.
Settings that contradict each other are an error rather than a silent choice.
"""
from __future__ import annotations

from dataclasses import dataclass

from megatron.config.fields import key

# The keys DeepSpeed's own sections take (DeepSpeedFP16Config / DeepSpeedBF16Config's fields in
# deepspeed/runtime/precision_config.py; tests/unit/test_precision_sections.py keeps these lists
# equal to the installed DeepSpeed's), plus fp16's 2022 `type`. Written out rather than imported:
# reading a config must not import DeepSpeed.
DEEPSPEED_FP16_KEYS = ("enabled", "auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
                       "consecutive_hysteresis", "min_loss_scale", "fp16_master_weights_and_grads")
DEEPSPEED_BF16_KEYS = ("enabled", "immediate_grad_update", "check_grad_overflow", "bf16_master_weights_and_grads",
                       "bf16_optimizer_states")
FP16_KEYS = (*DEEPSPEED_FP16_KEYS, "type")
BF16_KEYS = DEEPSPEED_BF16_KEYS
# NeoX's templates write the section's own name inside it (`fp16: {fp16: true, enabled: true}`,
# `bf16: {bf16: true, ...}`); DeeperSpeed, which NeoX runs on, ignored that key, and `enabled` alone
# decides. Accepted (a bool) in both sections alike and never passed on: DeepSpeed refuses it.
SECTION_KEYS = {"fp16": FP16_KEYS, "bf16": BF16_KEYS}


def section_for_deepspeed(name: str, section: dict | None) -> dict:
    """A precision section as DeepSpeed takes it: without the inner legacy flag and fp16's `type`."""
    return {k: v for k, v in (section or {}).items() if k != name and not (name == "fp16" and k == "type")}
_BF16_TYPES = ("bfloat16", "bf16")
_FP16_TYPES = ("fp16", "float16", "half")
_PRECISION_DTYPE = {"fp32": "fp32", "fp16": "fp16", "bfloat16": "bf16"}
DTYPE_NAMES = ("fp32", "bf16", "fp16")  # what `PrecisionConfig.dtype` (and --dtype flags) take


def torch_dtype(name: str):
    """The torch dtype of a precision name ('fp32', 'bf16', 'fp16'): the one place this map is
    written."""
    import torch  # lazy: importing the config must not load torch (CLI mistakes answer first)

    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if name not in dtypes:
        raise ValueError(f"unknown precision {name!r}; choose from: {', '.join(DTYPE_NAMES)}")
    return dtypes[name]


@dataclass(frozen=True)
class PrecisionConfig:
    precision: str | None = key(None, "Training precision; null = from fp16/bf16, else fp32.",
                                choices=("fp32", "fp16", "bfloat16"))
    fp16: dict | None = key(
        None, "DeepSpeed fp16 section {enabled, type, loss_scale (0 = dynamic), loss_scale_window, "
        "hysteresis, min_loss_scale, initial_scale_power}. type: bfloat16 means bf16 (2022 "
        "DeeperSpeed convention).")
    bf16: dict | None = key(
        None, "DeepSpeed bf16 section {enabled, immediate_grad_update, check_grad_overflow, "
        "bf16_master_weights_and_grads, bf16_optimizer_states}. Both sections also accept NeoX's inner "
        "`fp16: true` / `bf16: true` key, which (as in DeeperSpeed) changes nothing: `enabled` decides.")
    fp32_allreduce: bool = key(False, "All-reduce gradients in fp32.")

    def _from_sections(self) -> set[str]:
        found = set()
        if self.fp16 and self.fp16.get("enabled"):
            t = str(self.fp16.get("type", "fp16")).lower()
            found.add("bf16" if t in _BF16_TYPES else "fp16")
        if self.bf16 and self.bf16.get("enabled"):
            found.add("bf16")
        return found

    @property
    def dtype(self) -> str:
        """'fp32', 'fp16' or 'bf16'."""
        found = self._from_sections()
        if self.precision is not None:
            return _PRECISION_DTYPE[self.precision]
        return found.pop() if len(found) == 1 else "fp32"

    @property
    def torch_dtype(self):
        """torch.float32, torch.bfloat16 or torch.float16 (see `dtype`)."""
        return torch_dtype(self.dtype)

    def check(self) -> list[tuple[str, str]]:
        out = []
        for name, sec in (("fp16", self.fp16), ("bf16", self.bf16)):
            if sec is None:
                continue
            unknown = sorted(set(sec) - set(SECTION_KEYS[name]) - {name})
            if unknown:
                out.append((name, f"unknown keys {unknown}; known: {', '.join(SECTION_KEYS[name])} (and NeoX's "
                                  f"inner {name}: true/false, which changes nothing)"))
            if name in sec and not isinstance(sec[name], bool):
                out.append((name, f"the inner {name} key must be true or false (NeoX's templates write it; "
                                  "`enabled` decides)"))
        if self.fp16 is not None:
            t = self.fp16.get("type", "fp16")
            if not isinstance(t, str) or t.lower() not in _BF16_TYPES + _FP16_TYPES:
                out.append(("fp16", f"type must be fp16 or bfloat16, got {t!r}"))
        for name, sec in (("fp16", self.fp16), ("bf16", self.bf16)):
            if sec is not None and not isinstance(sec.get("enabled", False), bool):
                out.append((name, "enabled must be true or false"))
        if out:
            return out
        found = self._from_sections()
        if len(found) > 1:
            out.append(("bf16", "fp16 and bf16 are both enabled; enable one"))
        elif found and self.precision is not None and _PRECISION_DTYPE[self.precision] not in found:
            out.append(("precision", f"contradicts the enabled {found.pop()} section"))
        return out
