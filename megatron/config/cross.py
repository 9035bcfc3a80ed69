"""The rules that read more than one section, each declaring the sections it reads.

NeoXConfig.build runs a rule whenever every section it reads typed cleanly, so a typo in one
section does not hide a problem between two others (one load reports every problem it can),
and a rule never sees a section that could not be built (a partial config never crashes it).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

from megatron.config.position_recipes import position_recipe_problems


@dataclass(frozen=True)
class Rule:
    sections: tuple[str, ...]  # the NeoXConfig sections `check` reads, and no others
    check: Callable[[SimpleNamespace], list[tuple[str, str]]]  # -> [(key, what is wrong)]


def _shapes_split_by_tensor_parallel(cfg) -> list[tuple[str, str]]:
    """Every dimension tensor parallelism splits must divide by its degree: refused here, before
    anything costs, instead of in the workers at step 0 (a kv-head count TP cannot shard ended in
    170 lines of split_with_sizes tracebacks). NeoX divides the same ones (mpu.divide)."""
    m, tp = cfg.model, cfg.parallel.model_parallel_size
    if tp <= 1:
        return []
    out = []
    if m.num_attention_heads % tp:
        out.append(("num_attention_heads", f"must be divisible by model-parallel-size ({tp})"))
    if m.num_kv_heads is not None and m.kv_heads % tp:
        out.append(("num_kv_heads", f"{m.kv_heads} key/value heads cannot be split over model-parallel-size {tp} "
                    "(each rank holds num-kv-heads / model-parallel-size of them): use a model-parallel-size "
                    "that divides num-kv-heads"))
    widths = [w for w in dict.fromkeys(m.mlp_widths) if w % tp]
    if widths:
        out.append(("intermediate_size", f"the MLP width {widths[0]} is split over model-parallel-size {tp} and "
                    "must be divisible by it: choose intermediate-size (or mlp-multiple-of) so that it is"))
    if m.padded_vocab_size is not None and m.padded_vocab_size % tp:
        out.append(("padded_vocab_size", f"the vocabulary is split over model-parallel-size {tp} and must be "
                    "divisible by it (or leave padded-vocab-size unset: make-vocab-size-divisible-by x "
                    "model-parallel-size pads it)"))
    return out


def _projected_clamp_reaches_master_weights(cfg) -> list[tuple[str, str]]:
    # DeepSpeed's fp16 optimizer without ZeRO keeps its fp32 master weights where no API reaches
    if (cfg.model.pos_clamp == "projected" and cfg.precision.dtype == "fp16"
            and cfg.optimizer.zero_optimization.get("stage", 0) == 0):
        return [("pos_clamp", "projected cannot clamp the fp32 master weights of fp16 training without "
                 "ZeRO; use bf16, zero_optimization stage >= 1, or pos-clamp: straight-through")]
    return []


RULES = (
    Rule(("model", "parallel"), _shapes_split_by_tensor_parallel),
    Rule(("data", "model", "parallel"), position_recipe_problems),
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
