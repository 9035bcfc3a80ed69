"""The model's own layer numbering: GPT-NeoX's pipeline indices (GPT2ModelPipe) -> GPTModel keys.

    0        embedding            word embeddings (+ absolute positions)
    1        _pre_transformer_block   (a function: no parameters)
    2..L+1   transformer layers   layers.{idx - 2}.*
    L+2      _post_transformer_block  (a function)
    L+3      final norm           norm.*  -> final_norm.*
    L+4      output layer         final_linear.weight (untied) or word_embeddings.weight (tied)

The shared positional scheme (`position.*`) has the same key wherever it is stored. The pipeline
model (megatron/model/pipeline.py) builds its stages in this order and the pipeline checkpoint
reader maps layer files back with it, so the numbering lives here, with the model.
"""
from __future__ import annotations

from megatron.errors import UserError


def sequential_key(idx: int, key: str, num_layers: int, tied: bool) -> str:
    """GPTModel state_dict key of `key` in NeoX pipeline layer `idx`."""
    if key.startswith("position."):
        return key  # the shared scheme, wherever it is stored
    if idx == 0 or (tied and idx == num_layers + 4):
        if key == "word_embeddings.weight":
            return key
    elif 2 <= idx <= num_layers + 1:
        return f"layers.{idx - 2}.{key}"
    elif idx == num_layers + 3 and key.startswith("norm."):
        return "final_norm." + key[len("norm."):]
    elif idx == num_layers + 4 and key == "final_linear.weight":
        return "output_layer.weight"
    raise UserError(f"pipeline layer {idx} key {key!r} has no GPTModel counterpart "
                    f"(num_layers {num_layers}, tied embeddings {tied})")
