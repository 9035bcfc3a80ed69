"""NeoX keys of features this stack does not have, refused by the feature's name.

A NeoX config that turns on Transformer Engine, mixture-of-experts, bitsandbytes optimizers, Mamba,
RWKV, gMLP or DeepSpeed's sparse attention would otherwise meet a list of "unknown key" lines; it
gets one line per feature instead, naming what is missing. The same keys at NeoX's defaults
(the feature off: `moe_num_experts: 1`, `te_mha: false`) change nothing and are accepted.
An attention_config naming one of these architectures' layer types ("mamba", "gmlp", ...) joins that
feature's line, so a NeoX Mamba config gets one line about Mamba, not one for its keys and another
for its attention types; the other types are judged in attention_types.py."""
from __future__ import annotations

from dataclasses import dataclass

from megatron.config.errors import UNKNOWN, Problem


@dataclass(frozen=True, eq=False)  # eq=False: hashable by identity, usable as a dict key
class Feature:
    name: str
    prefixes: tuple[str, ...]  # NeoX keys (underscore form) that start with one of these
    keys: tuple[str, ...] = ()  # ... or are one of these
    off: dict | None = None  # key -> NeoX's default, the value at which the feature is off
    attention_types: tuple[str, ...] = ()  # NeoX attention_config types that are this feature

    def owns(self, key: str) -> bool:
        return key in self.keys or key.startswith(self.prefixes)

    def is_off(self, key: str, value) -> bool:
        if self.off is not None and key in self.off:
            return value == self.off[key]
        return value is False or value is None  # a switch left off


FEATURES = (
    Feature("Transformer Engine (NVIDIA's fused/FP8 layers)", ("te_",)),
    Feature("mixture-of-experts (MoE) layers", ("moe_",), off={"moe_num_experts": 1}),
    Feature("bitsandbytes 8-bit optimizers", (), ("use_bnb_optimizer",)),
    Feature("Mamba blocks (a state-space architecture, not attention)", ("mamba_",), attention_types=("mamba",)),
    Feature("RWKV blocks (a recurrent architecture, not attention)", ("rwkv_",), attention_types=("rwkv",)),
    Feature("gMLP/aMLP blocks (a gated MLP in place of attention)", ("gmlp_",), attention_types=("gmlp", "amlp")),
    Feature("DeepSpeed block-sparse attention", (), ("sparsity_config",),
            attention_types=("sparse_fixed", "sparse_variable", "bigbird", "bslongformer")),
    Feature("NeoX's own srun launch options (deepspeed_slurm, comment; here `launcher: slurm` through deepy.py, "
            "or tools/slurm/train.sbatch, starts the workers with srun)", (), ("deepspeed_slurm", "comment")),
)


def feature_of(key: str) -> Feature | None:
    return next((f for f in FEATURES if f.owns(key)), None)


def feature_of_attention_type(name) -> Feature | None:
    return next((f for f in FEATURES if name in f.attention_types), None)


def attention_type_names(config) -> list:
    """Every type named in a raw attention_config ([[[types...], count], ...] or a flat list of
    types), in order; what cannot be read is left to attention_types.problems to report."""
    if not isinstance(config, (list, tuple)):
        return []
    out = []
    for item in config:
        if isinstance(item, (list, tuple)) and item and isinstance(item[0], (list, tuple)):
            out += list(item[0])
        else:
            out.append(item)
    return [t for t in out if isinstance(t, str)]


def refusals(found: dict[Feature, list[tuple[str, str, object, str]]]) -> list[Problem]:
    """One problem per feature turned on: {feature: [(canonical key, key as written, value, origin)]};
    keys left at their off value are not problems."""
    out = []
    for feature, items in found.items():
        on = [(k, v, o) for name, k, v, o in items if not feature.is_off(name, v)]
        if on:
            where = ", ".join(f"{k} = {v!r} ({o})" for k, v, o in on[:4]) + (" ..." if len(on) > 4 else "")
            out.append(Problem(UNKNOWN, f"{feature.name}: not supported by this stack ({where}); remove "
                                        f"{'this key' if len(on) == 1 else 'these keys'} (or use NeoX itself)"))
    return out
