"""This stack's pipeline checkpoint (per-layer files) -> one GPTModel state_dict.

A pipeline checkpoint directory holds `layer_{idx:02d}-model_{tp:02d}-model_states.pt`, one plain
state_dict per NeoX layer index (numbering: megatron/model/layer_numbering.sequential_key). The
shared positional scheme is stored in every file that uses it (`position.*`); all copies must agree.
No DeepSpeed import here: evaluation reads files only.
"""
from __future__ import annotations

import torch

from megatron.checkpoint import safe_load
from megatron.checkpoint.errors import CheckpointError
from megatron.checkpoint.layout import layer_files
from megatron.model.layer_numbering import sequential_key


def _rank0_layer_files(tag_dir: str) -> dict[int, str]:
    """{NeoX layer index: file} for tensor-parallel rank 00 (the only one pipelines write now)."""
    out = {}
    for (tp, idx), path in layer_files(tag_dir).items():
        if tp != 0:
            raise CheckpointError(f"{path}: tensor-parallel pipeline checkpoints cannot be merged yet")
        out[idx] = path
    if not out:
        raise CheckpointError(f"{tag_dir} holds no layer_XX-model_00-model_states.pt files: not a pipeline checkpoint")
    return out


def _put(state: dict, key: str, value: torch.Tensor, where: str) -> None:
    if key in state:
        if not torch.equal(state[key], value):
            raise CheckpointError(f"{where}: {key} differs from another layer file's copy; the replicas "
                                  "of a shared parameter must be identical")
        return
    state[key] = value


def merge_pipeline_to_sequential(tag_dir: str, read=None) -> dict[str, torch.Tensor]:
    """State_dict for GPTModel (strict) from a pipeline checkpoint's `global_stepN` directory.
    `read(path) -> dict` reads one layer file (default: the safe reader, safe_load.read_checkpoint_file)."""
    read = read or safe_load.read_checkpoint_file
    layers = {i: read(p) for i, p in _rank0_layer_files(tag_dir).items()}
    norms = [i for i, sd in layers.items() if any(k.startswith("norm.") for k in sd)]
    if len(norms) != 1:
        raise CheckpointError(f"{tag_dir}: expected exactly one final-norm layer file, found {len(norms)}")
    L = norms[0] - 3
    # Tied embeddings: DeepSpeed writes no L+4 file (NeoX's DeeperSpeed writes the embedding again).
    tied = "final_linear.weight" not in layers.get(L + 4, {})
    expected = {0, *range(2, L + 2), L + 3} | ({L + 4} if not tied or L + 4 in layers else set())
    if set(layers) != expected:
        raise CheckpointError(f"{tag_dir}: layer files {sorted(layers)} do not form a NeoX pipeline of "
                              f"{L} layers (expected {sorted(expected)})")
    state: dict[str, torch.Tensor] = {}
    for idx, layer in sorted(layers.items()):
        for key, value in layer.items():
            _put(state, sequential_key(idx, key, L, tied), value, f"layer_{idx:02d}")
    return state
