"""NeoXConfig: the validated, sectioned configuration the rest of the stack reads.

Frozen on purpose: a config validated once must not be changed behind the validator's back (NeoX's
NeoXArgs is one mutable object that code changes as it goes, so a value read late need not be the
one validated). Derive a changed copy with `replace()`.
"""
from __future__ import annotations

import copy
import dataclasses
import os
from functools import partial

import yaml

from megatron.config.checkpoint import CheckpointConfig
from megatron.config.cross import cross_section_problems
from megatron.config.data import DataConfig
from megatron.config.describe import describe
from megatron.config.ds_json import DeepSpeedConfig, deepspeed_config
from megatron.config.errors import MISSING, ConfigError, Problem
from megatron.config.logs import LoggingConfig
from megatron.config.merge import located, merge_entries
from megatron.config.model import ModelConfig
from megatron.config.optimizer import OptimizerConfig
from megatron.config.originals import read_originals
from megatron.config.parallel import ParallelConfig
from megatron.config.paths import derive_paths
from megatron.config.precision import PrecisionConfig
from megatron.config.schema import KEYS, SECTIONS
from megatron.config.sources import OVERRIDE_ORIGIN, Entry, read_entries
from megatron.config.training import TrainingConfig
from megatron.config.validate import type_section

_HEADER = ("# Resolved configuration (NeoX flat keys, every key explicit), written by megatron.config.\n"
           "# Load it with NeoXConfig.from_file(path), or pass it to deepy.py as the only config file.\n")


def _rules_beside_missing_keys(sec_cls, kwargs: dict, sec_problems: list[Problem], origins: dict) -> list[Problem]:
    """A section whose only problems are required keys no file sets still has its own rules judged
    on the keys that are set (a Llama config without a training section: train-iters and the
    micro-batch in one message, not one per run); a rule that needs a missing key is skipped."""
    if any(p.kind != MISSING for p in sec_problems):
        return []
    try:
        section = sec_cls(**kwargs)
        return located(section.check(), partial(getattr, section), origins)
    except (TypeError, ValueError, AttributeError):  # a rule read a missing (None) key
        return []


@dataclasses.dataclass(frozen=True)
class NeoXConfig:
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    parallel: ParallelConfig = dataclasses.field(default_factory=ParallelConfig)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    training: TrainingConfig = dataclasses.field(default_factory=TrainingConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    logging: LoggingConfig = dataclasses.field(default_factory=LoggingConfig)
    precision: PrecisionConfig = dataclasses.field(default_factory=PrecisionConfig)
    deepspeed: DeepSpeedConfig = dataclasses.field(default_factory=DeepSpeedConfig)
    # {basename: raw text} of each file that was merged; NeoX stores these in checkpoints.
    config_files: dict = dataclasses.field(default_factory=dict, compare=False)
    # The merged entries as given (before defaults were derived), so replace() re-derives them.
    _sources: tuple = dataclasses.field(default=(), repr=False, compare=False)

    @classmethod
    def build(cls, entries: list[Entry], texts: dict[str, str], run_name: str,
              problems: list[Problem] = ()) -> NeoXConfig:
        """Type, construct and check every section from the merged entries; derive the defaults
        that depend on other keys. Raises one ConfigError with every problem (`problems`: those
        found reading the files; then keys from unreadable files are unknown, so only the files
        and typos are reported)."""
        merged, origins, found = merge_entries(entries)
        if problems:
            raise ConfigError(list(problems) + found)
        sections = {}
        for sec, sec_cls in SECTIONS.items():
            kwargs, sec_problems = type_section(sec, merged, origins)
            found += sec_problems
            if sec_problems:  # its own rules and the rules reading it would judge guessed values
                found += _rules_beside_missing_keys(sec_cls, kwargs, sec_problems, origins)
                continue
            sections[sec] = sec_cls(**kwargs)
            found += located(sections[sec].check(), partial(getattr, sections[sec]), origins)
        # every rule across sections whose sections built: a typo elsewhere does not hide it
        found += located(cross_section_problems(sections), partial(_section_value, sections), origins)
        if found:
            raise ConfigError(found)
        cfg = cls(**sections, config_files=dict(texts), _sources=tuple(entries))
        return derive_paths(cfg, run_name)

    @classmethod
    def from_file(cls, path) -> NeoXConfig:
        """A config file; a resolved_config.yml also gets the original files stored beside it
        (megatron/config/originals.py) as config_files, so checkpoints keep them."""
        cfg = load_config([path])
        originals = read_originals(path)
        return dataclasses.replace(cfg, config_files=originals) if originals else cfg

    def to_flat_dict(self) -> dict:
        """{underscore_key: value} for every key, resolved; plain JSON/YAML types only."""
        out = {}
        for name, info in KEYS.items():
            value = getattr(getattr(self, info.section), name)
            out[name] = list(value) if isinstance(value, tuple) else copy.deepcopy(value)
        return out

    def save(self, path, header: str | None = None) -> None:
        """Write the resolved flat YAML (sorted keys); from_file(path) gives the same settings."""
        os.makedirs(os.path.dirname(os.fspath(path)) or ".", exist_ok=True)
        text = _HEADER + "".join(f"# {line}\n" for line in (header or "").splitlines())
        text += yaml.safe_dump(self.to_flat_dict(), sort_keys=True, default_flow_style=False)
        tmp = f"{os.fspath(path)}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)

    def replace(self, **flat_overrides) -> NeoXConfig:
        """A validated copy with some flat keys changed; derived defaults are derived again."""
        sources = list(self._sources) or [Entry(k, v, "config") for k, v in self.to_flat_dict().items()]
        sources += [Entry(k, v, OVERRIDE_ORIGIN) for k, v in flat_overrides.items()]
        run_dir = self.logging.run_dir or "runs/default"
        return self.build(sources, dict(self.config_files), os.path.basename(run_dir))

    def deepspeed_config(self, dp_world_size: int) -> dict:
        return deepspeed_config(self, dp_world_size)

    def refusal(self, issues: list[tuple[str, str]]) -> ConfigError:
        """A ConfigError for (key, what is wrong) pairs judged outside the loader (the size of the
        model this config builds: megatron/model/size.py), each with its value and where it was set."""
        _, origins, _ = merge_entries(list(self._sources))
        return ConfigError(located(issues, lambda name: getattr(getattr(self, KEYS[name].section), name), origins))

    def describe(self) -> str:
        return describe(self)


def _section_value(sections: dict, name: str):
    return getattr(sections[KEYS[name].section], name)


def load_config(paths=(), overrides: dict | None = None) -> NeoXConfig:
    """Merge the YAML files in order (later wins), then `overrides` (same flat keys), validate all.

    Raises ConfigError listing every problem found.
    """
    return NeoXConfig.build(*read_entries(paths, overrides))
