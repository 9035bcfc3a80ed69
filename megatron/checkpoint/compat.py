"""Whether a checkpoint fits the model a run builds, decided from its saved arguments before any
weight is read: DeepSpeed's and torch's strict loads end in a traceback listing every tensor,
while a user changed one key. One message names each differing key (NeoX spelling) and both values.

Used by training's resume (megatron/training/checkpoint.py, also for seq-length: a changed
length changes the sample order, see `allow-seq-length-change`) and by the evaluation-side reader
(reader.py, for `-o` overrides of evaluate.py, generate.py, tools/export_hf.py)."""
from __future__ import annotations

import os

from megatron.checkpoint.client import CHECKED_ARGS
from megatron.checkpoint.errors import CheckpointError
from megatron.checkpoint.layout import RESOLVED_CONFIG
from megatron.config import NeoXConfig

SHAPE_KEYS = CHECKED_ARGS + ("padded_vocab_size",)  # keys that change the weights' shapes or names


def differences(saved: dict, current: dict, keys, label: str = "config") -> list[str]:
    """'hidden-size: checkpoint 32, config 64' for each key set in both and different
    (num-kv-heads null means every head: equal to num-attention-heads)."""
    saved, current = _normalised(saved), _normalised(current)
    return [f"{k.replace('_', '-')}: checkpoint {saved[k]!r}, {label} {current[k]!r}"
            for k in keys if saved.get(k) is not None and current.get(k) is not None and saved[k] != current[k]]


def _normalised(args: dict) -> dict:
    if args.get("num_kv_heads") is None and args.get("num_attention_heads") is not None and "num_kv_heads" in args:
        return {**args, "num_kv_heads": args["num_attention_heads"]}
    return args


def saved_model(tag_dir: str):
    """The model section of the checkpoint's resolved_config.yml, or None (not written by this stack)."""
    path = os.path.join(tag_dir, RESOLVED_CONFIG)
    if not os.path.isfile(path):
        return None

    return NeoXConfig.from_file(path).model


def refuse_shape_change(tag_dir: str, saved: dict, current: dict, fix: str, label: str = "config") -> None:
    """CheckpointError naming every SHAPE_KEYS difference, or nothing."""
    bad = differences(saved, current, SHAPE_KEYS, label)
    if bad:
        raise CheckpointError(f"checkpoint {tag_dir} was saved with another model: {'; '.join(bad)}. {fix}")


def strict_load_error(e: BaseException, tag_dir: str) -> CheckpointError | None:
    """torch's 'Error(s) in loading state_dict' (a key outside SHAPE_KEYS changed the model, e.g.
    no-weight-tying) as one CheckpointError naming its first problems; None for anything else."""
    text = str(e)
    if not (isinstance(e, RuntimeError) and "Error(s) in loading state_dict" in text):
        return None
    lines = [line.strip() for line in text.splitlines()[1:] if line.strip()]
    shown = "; ".join(line[:160] for line in lines[:3]) + (f" (and {len(lines) - 3} more)" if len(lines) > 3 else "")
    return CheckpointError(f"the weights of checkpoint {tag_dir} do not fit the model this config builds: {shown}. "
                           "Set the model keys back to the checkpoint's (its resolved_config.yml lists them)")
