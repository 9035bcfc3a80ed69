"""The model's own pipeline layer numbering -> GPTModel state_dict keys (see megatron/model/pipeline.py
for the numbering). Reading a pipeline checkpoint's layer files: megatron/checkpoint/pipeline.py."""
from __future__ import annotations

from megatron.checkpoint.errors import CheckpointError


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
    raise CheckpointError(f"pipeline layer {idx} key {key!r} has no GPTModel counterpart "
                          f"(num_layers {num_layers}, tied embeddings {tied})")
