"""GPT-NeoX's layer numbering (its GPT2ModelPipe, the indices of pipeline files and of the
sequential model's `sequential.<idx>`), in one place, with the model whose stages it orders:

    0        embedding            word embeddings (+ absolute positions)
    1        _pre_transformer_block   (a function: no parameters)
    2..L+1   transformer layers   layers.{idx - 2}.*
    L+2      _post_transformer_block  (a function)
    L+3      final norm           norm.*  -> final_norm.*
    L+4      output layer         final_linear.weight (untied) or word_embeddings.weight (tied)

`slot` and `index` read it both ways. Our pipeline files (megatron/parallel/pipeline.py) keep our
module names inside each index (`sequential_key`); NeoX's and the 2022 KERPLE code's names inside
each index are megatron/checkpoint/neox_keys.py's. The shared positional scheme (`position.*`) has
the same key wherever it is stored.
"""
from __future__ import annotations

from megatron.errors import UserError

EMBEDDING, FUNCTION, LAYER, FINAL_NORM, OUTPUT = "embedding", "function", "layer", "final_norm", "output"


def slot(idx: int, num_layers: int) -> tuple[str, int | None]:
    """(what pipeline index `idx` holds, the transformer layer's number for a layer, else None)."""
    L = num_layers
    if idx == 0:
        return EMBEDDING, None
    if 2 <= idx <= L + 1:
        return LAYER, idx - 2
    if idx == L + 3:
        return FINAL_NORM, None
    if idx == L + 4:
        return OUTPUT, None
    if idx in (1, L + 2):
        return FUNCTION, None
    raise UserError(f"pipeline index {idx} is past the model's {L} layers (the output layer is {L + 4})")


def index(kind: str, num_layers: int, layer: int | None = None) -> int:
    """The pipeline index of `kind` (inverse of slot)."""
    return {EMBEDDING: 0, FINAL_NORM: num_layers + 3, OUTPUT: num_layers + 4}.get(kind) if kind != LAYER \
        else layer + 2


def sequential_key(idx: int, key: str, num_layers: int, tied: bool) -> str:
    """GPTModel state_dict key of `key` in our pipeline layer `idx`."""
    if key.startswith("position."):
        return key  # the shared scheme, wherever it is stored
    kind, layer = slot(idx, num_layers)
    if key == "word_embeddings.weight" and (kind == EMBEDDING or (tied and kind == OUTPUT)):
        return key
    if kind == LAYER:
        return f"layers.{layer}.{key}"
    if kind == FINAL_NORM and key.startswith("norm."):
        return "final_norm." + key[len("norm."):]
    if kind == OUTPUT and key == "final_linear.weight":
        return "output_layer.weight"
    raise UserError(f"pipeline layer {idx} key {key!r} has no GPTModel counterpart "
                    f"(num_layers {num_layers}, tied embeddings {tied})")
