"""The map from NeoX flat keys (`num-layers` / `num_layers`) to `section.field`.

Flat names are field names, so they must be unique across sections: checked at import, where a
clash would otherwise silently route a user's key to the wrong section.
"""
from __future__ import annotations

import dataclasses
import typing

from megatron.config.checkpoint import CheckpointConfig
from megatron.config.data import DataConfig
from megatron.config.ds_json import DeepSpeedConfig
from megatron.config.fields import default_of, type_str
from megatron.config.logs import LoggingConfig
from megatron.config.model import ModelConfig
from megatron.config.optimizer import OptimizerConfig
from megatron.config.parallel import ParallelConfig
from megatron.config.precision import PrecisionConfig
from megatron.config.training import TrainingConfig

# section attribute on NeoXConfig -> section class, in documentation order
SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "parallel": ParallelConfig,
    "optimizer": OptimizerConfig,
    "training": TrainingConfig,
    "data": DataConfig,
    "checkpoint": CheckpointConfig,
    "logging": LoggingConfig,
    "precision": PrecisionConfig,
    "deepspeed": DeepSpeedConfig,
}

# Extra spellings of a key -> its field name. NeoX accepts `clip_grad` for gradient_clipping.
ALIASES: dict[str, str] = {"clip_grad": "gradient_clipping"}


@dataclasses.dataclass(frozen=True)
class KeyInfo:
    name: str  # flat underscore key == field name
    section: str
    field: dataclasses.Field
    type: typing.Any  # resolved annotation

    @property
    def hyphen(self) -> str:
        return self.name.replace("_", "-")


def _build() -> dict[str, KeyInfo]:
    keys: dict[str, KeyInfo] = {}
    for sec, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            assert f.name not in keys, f"flat key {f.name!r} in both {keys[f.name].section} and {sec}"
            keys[f.name] = KeyInfo(f.name, sec, f, hints[f.name])
    for alias, target in ALIASES.items():
        assert alias not in keys and target in keys, f"bad alias {alias!r} -> {target!r}"
    return keys


KEYS: dict[str, KeyInfo] = _build()


def canonical(raw_key: str) -> str:
    """'num-layers' -> 'num_layers'."""
    return raw_key.replace("-", "_")


def hyphen(name: str) -> str:
    return name.replace("_", "-")


def all_keys() -> list[tuple[str, str, str, object, str]]:
    """[(flat_key, section, type_str, default, doc)] for every key, in documentation order."""
    out = []
    for k in KEYS.values():
        default = "required" if k.field.metadata.get("required") else default_of(k.field)
        out.append((k.name, k.section, type_str(k.type), default, k.field.metadata.get("doc", "")))
    return out
