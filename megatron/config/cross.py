"""The rules that read more than one section, each declaring the sections it reads.

NeoXConfig.build runs a rule whenever every section it reads typed cleanly, so a typo in one
section does not hide a problem between two others (one load reports every problem it can),
and a rule never sees a section that could not be built (a partial config never crashes it).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace


@dataclass(frozen=True)
class Rule:
    sections: tuple[str, ...]  # the NeoXConfig sections `check` reads, and no others
    check: Callable[[SimpleNamespace], list[tuple[str, str]]]  # -> [(key, what is wrong)]


def _heads_split_by_tensor_parallel(cfg) -> list[tuple[str, str]]:
    tp = cfg.parallel.model_parallel_size
    if cfg.model.num_attention_heads % tp:
        return [("num_attention_heads", f"must be divisible by model-parallel-size ({tp})")]
    return []


def _projected_clamp_reaches_master_weights(cfg) -> list[tuple[str, str]]:
    # DeepSpeed's fp16 optimizer without ZeRO keeps its fp32 master weights where no API reaches
    if (cfg.model.pos_clamp == "projected" and cfg.precision.dtype == "fp16"
            and cfg.optimizer.zero_optimization.get("stage", 0) == 0):
        return [("pos_clamp", "projected cannot clamp the fp32 master weights of fp16 training without "
                 "ZeRO; use bf16, zero_optimization stage >= 1, or pos-clamp: straight-through")]
    return []


RULES = (
    Rule(("model", "parallel"), _heads_split_by_tensor_parallel),
    Rule(("model", "precision", "optimizer"), _projected_clamp_reaches_master_weights),
)


def cross_section_problems(sections: dict[str, object]) -> list[tuple[str, str]]:
    """(key, what is wrong) from every rule whose sections are all in `sections` (the built ones)."""
    view = SimpleNamespace(**sections)
    out = []
    for rule in RULES:
        if all(name in sections for name in rule.sections):
            out += rule.check(view)
    return out
