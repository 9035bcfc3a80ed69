"""The NeoX family's adapter (NeoX sequential and pipeline layouts, Pythia, the 2022 KERPLE code):
NeoX / KERPLE parameter names <-> our GPTModel state_dict names, one rename table read both ways
(`our_key`, `neox_key`).

NeoX's layer numbering is megatron/model/layer_numbering.py's (`slot`, `index`). The positional
scheme's tensors live inside a layer (`attention.rpe.*` is the SAME module in every layer in the
KERPLE code), and map to our one shared `position.*`.
"""
from __future__ import annotations

from megatron.model.layer_numbering import EMBEDDING, FINAL_NORM, LAYER, OUTPUT, index, slot

# Per-transformer-layer renames (prefix match, first wins). KERPLE/legacy MLP names and the
# current NeoX `mlp.linear1/linear2` both go to our dense_h_to_4h / dense_4h_to_h.
LAYER_RENAMES = (
    ("attention.rpe.", "position."),  # KERPLE bias_p/bias_a/wei_p/wei_a, T5 weight
    ("attention.alibi_embed.", "position."),  # slopes
    ("attention.rotary_emb.", "position."),  # inv_freq
    ("mlp.linear1.", "mlp.dense_h_to_4h."),
    ("mlp.linear2.", "mlp.dense_4h_to_h."),
    ("attention.query_key_value.", "attention.query_key_value."),
    ("attention.dense.", "attention.dense."),
    ("mlp.dense_h_to_4h.", "mlp.dense_h_to_4h."),
    ("mlp.dense_4h_to_h.", "mlp.dense_4h_to_h."),
    ("input_layernorm.", "input_layernorm."),
    ("post_attention_layernorm.", "post_attention_layernorm."),
)

# Buffers NeoX/HF keep that carry no learned information (recomputed caches, causal masks).
IGNORED_SUFFIXES = ("_extra_state", "attention.bias", "attention.masked_bias",
                    "rotary_emb.cos_cached", "rotary_emb.sin_cached")


def _norm_param(name: str) -> str:
    """NeoX's RMSNorm calls its gain `scale`; torch's RMSNorm (ours) calls it `weight`."""
    return name[: -len("scale")] + "weight" if name.endswith(".scale") else name


def our_key(idx: int, key: str, num_layers: int) -> str | None:
    """Our name for NeoX layer `idx`'s `key`; None for ignorable buffers; ValueError if unknown."""
    if key.endswith(IGNORED_SUFFIXES):
        return None
    L = num_layers
    kind, layer = slot(idx, L) if 0 <= idx <= L + 4 else (None, None)
    if kind == EMBEDDING:
        if key == "word_embeddings.weight":
            return key
        if key.startswith("position_embeddings."):  # learned `.weight`, sinusoidal `.inv_freq`
            return "position." + key[len("position_embeddings."):]
    elif kind == LAYER:
        for old, new in LAYER_RENAMES:
            if key.startswith(old):
                mapped = new + key[len(old):]
                return mapped if mapped.startswith("position.") else f"layers.{layer}.{_norm_param(mapped)}"
    elif kind == FINAL_NORM and key.startswith("norm."):
        return _norm_param("final_norm." + key[len("norm."):])
    elif kind == OUTPUT:
        if key == "final_linear.weight":
            return "output_layer.weight"
        if key == "word_embeddings.weight":  # tied output: DeeperSpeed writes the embedding again
            return "word_embeddings.weight"
    raise ValueError(f"NeoX layer {idx} key {key!r} has no counterpart in our model ({L} layers: "
                     f"embedding 0, transformer 2..{L + 1}, norm {L + 3}, output {L + 4})")


def neox_key(ours: str, num_layers: int, rms_norm: bool = False) -> tuple[int, str]:
    """(NeoX layer index, NeoX name) of our tensor `ours`: our_key read backwards, through the same
    tables (current NeoX's names where several map to ours; a positional tensor goes to layer 2,
    where the 2022 KERPLE code keeps its first copy)."""
    def norm(name: str) -> str:
        return name[: -len("weight")] + "scale" if rms_norm and name.endswith("norm.weight") else name

    if ours == "word_embeddings.weight":
        return index(EMBEDDING, num_layers), ours
    if ours == "output_layer.weight":
        return index(OUTPUT, num_layers), "final_linear.weight"
    if ours.startswith("final_norm."):
        return index(FINAL_NORM, num_layers), norm("norm." + ours[len("final_norm."):])
    if ours.startswith("position."):
        return index(LAYER, num_layers, 0), "attention.rpe." + ours[len("position."):]
    if ours.startswith("layers."):
        layer, rest = ours.split(".", 2)[1:]
        for old, new in LAYER_RENAMES:  # the first NeoX name of each of ours
            if rest.startswith(new) and not new.startswith("position."):
                return index(LAYER, num_layers, int(layer)), norm(old + rest[len(new):])
    raise ValueError(f"our tensor {ours!r} has no NeoX name")
