"""NeoX's `attention_config`: the attention type of every layer, and what each type is here.

NeoX writes it as [[[types...], count], ...] (count "all" repeats the pattern over every layer) and
expands it with megatron/utils.py's expand_attention_types; the expanded list must have one type
per layer (arguments.py asserts it). Here "global" and "flash" are both our attention: flash-attn
computes the same causal softmax attention as NeoX's global path, and which kernel runs is
attention-backend's choice (auto). Every other type is a different architecture or a DeepSpeed
block-sparse pattern and is refused by name: "local" here (it has a token-exact alternative), the
rest on their feature's one line (megatron/config/foreign.py)."""
from __future__ import annotations

TYPES = ("global", "local", "sparse_fixed", "sparse_variable", "bigbird", "bslongformer", "gmlp", "amlp",
         "flash", "rwkv", "mamba")  # NeoX's ATTENTION_TYPE_CHOICES
SAME_AS_OURS = ("global", "flash")
REFUSED = {  # the types that are no feature of foreign.py (those are refused there)
    "local": "DeepSpeed's block-sparse sliding window (LocalSlidingWindowSparsityConfig: whole 16-token "
             "blocks, not a token window); for a token-exact sliding window use attention-window "
             "(or sliding-window-width) with global attention",
}


def expand(config, num_layers: int) -> list:
    """NeoX's expand_attention_types: the per-layer list (ValueError for a malformed entry)."""
    if all(isinstance(t, str) for t in config):
        return list(config)
    out = []
    for item in config:
        if not (isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], (list, tuple))
                and item[0] and (item[1] == "all" or (isinstance(item[1], int) and item[1] >= 0))):
            raise ValueError(f"entry {item!r} is not [[types...], count or \"all\"] (e.g. [[\"flash\"], 12])")
        types, count = list(item[0]), item[1]
        if count == "all":
            if num_layers % len(types):
                raise ValueError(f"the pattern {types} does not divide num-layers ({num_layers})")
            return types * (num_layers // len(types))  # NeoX returns here: "all" ends the list
        out += types * count
    return out


def problems(config, num_layers: int) -> list[str]:
    """What is wrong with an attention_config for this many layers (empty: every layer is ours)."""
    if not isinstance(config, (list, tuple)) or not config:
        return ["must be a non-empty list like [[[\"global\"], NUM_LAYERS]]"]
    try:
        layers = expand(config, num_layers)
    except ValueError as e:
        return [str(e)]
    unknown = sorted({t for t in layers if t not in TYPES}, key=str)
    if unknown:
        return [f"unknown attention type(s) {unknown}; NeoX's are {', '.join(TYPES)}"]
    if len(layers) != num_layers:
        return [f"gives {len(layers)} layer types for num-layers {num_layers} (NeoX requires one per layer)"]
    refused = [t for t in dict.fromkeys(layers) if t in REFUSED]
    return [f"attention type {t!r} is not supported here: {REFUSED[t]}" for t in refused]
