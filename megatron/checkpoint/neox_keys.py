"""NeoX / KERPLE parameter names -> our GPTModel state_dict names.

NeoX numbers its layers (pipeline files and `sequential.<idx>`) as: 0 embedding, 1 a function
(no weights), 2..L+1 transformer layers, L+2 a function, L+3 the final norm, L+4 the output
layer. The positional scheme's tensors live inside a layer (`attention.rpe.*` is the SAME
module in every layer in the KERPLE code), and map to our one shared `position.*`.
"""
from __future__ import annotations

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
    if idx == 0:
        if key == "word_embeddings.weight":
            return key
        if key.startswith("position_embeddings."):  # learned `.weight`, sinusoidal `.inv_freq`
            return "position." + key[len("position_embeddings."):]
    elif 2 <= idx <= L + 1:
        for old, new in LAYER_RENAMES:
            if key.startswith(old):
                mapped = new + key[len(old):]
                return mapped if mapped.startswith("position.") else f"layers.{idx - 2}.{_norm_param(mapped)}"
    elif idx == L + 3 and key.startswith("norm."):
        return _norm_param("final_norm." + key[len("norm."):])
    elif idx == L + 4:
        if key == "final_linear.weight":
            return "output_layer.weight"
        if key == "word_embeddings.weight":  # tied output: DeeperSpeed writes the embedding again
            return "word_embeddings.weight"
    raise ValueError(f"NeoX layer {idx} key {key!r} has no counterpart in our model ({L} layers: "
                     f"embedding 0, transformer 2..{L + 1}, norm {L + 3}, output {L + 4})")
