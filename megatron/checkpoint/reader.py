"""The one checkpoint reader: any layout we accept -> a full TP=1 GPTModel state dict.

    ck = read_tp1_state("runs/x/checkpoints")            # the step `latest` names
    ck.state, ck.client, ck.cfg, ck.tag_dir, ck.layout, ck.vocab_size

Layouts (layout.py decides which): ours (one file), ours-tp (shards merged, tp_merge.py),
ours-pipeline (layer files, pipeline.py), ours-zero3 (partitions consolidated by DeepSpeed's
zero_to_fp32, through the safe reader), neox-pipeline / neox-sequential (NeoX / KERPLE 2022,
neox.py). Every file is read by safe_load.read_checkpoint_file (weights_only=True + allow-list,
then the NaN/inf check). Used by evaluation (evaluate.py, generate.py, tools/export_hf.py),
training's `load:` of a NeoX checkpoint, and the TP=1 writer (tools/merge_tp_checkpoint.py,
tools/convert_neox_checkpoint.py).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from megatron.checkpoint import safe_load
from megatron.checkpoint.client import CHECKED_ARGS, client_state
from megatron.checkpoint.compat import refuse_shape_change
from megatron.checkpoint.deepspeed_engine import safe_zero_to_fp32
from megatron.checkpoint.errors import CheckpointError
from megatron.checkpoint.layout import (
    MODEL_FILE,
    RESOLVED_CONFIG,
    detect_layout,
    is_neox,
    shard_files,
    zero3_model_files,
)
from megatron.checkpoint.manifest import check_step
from megatron.checkpoint.neox import read_neox_state
from megatron.checkpoint.pipeline import merge_pipeline_to_sequential
from megatron.checkpoint.tags import tag_dir_of
from megatron.checkpoint.tp_merge import merge_blobs
from megatron.config import NeoXConfig
from megatron.errors import UserError


@dataclass
class Tp1Checkpoint:
    state: dict  # GPTModel state_dict, TP=1
    client: dict  # client state (iteration, args with model_parallel_size 1, config, ...), no module/optimizer
    cfg: object | None  # NeoXConfig with TP=1 (ours: resolved_config.yml, None when absent; NeoX: its YAML)
    tag_dir: str
    layout: str  # a key of layout.DESCRIPTIONS

    @property
    def vocab_size(self) -> int | None:
        return (self.client.get("args") or {}).get("padded_vocab_size")


def read_tp1_state(ckpt_dir: str, tag: str | None = None, *, config=None, overrides: dict | None = None,
                   trust: bool = False, dtype: torch.dtype | None = None,
                   allow_nonfinite: bool = False) -> Tp1Checkpoint:
    """Read step `tag` (None: the one `latest` names) of ckpt_dir as a TP=1 checkpoint.

    `config` (NeoX only): YAML files instead of global_stepN/configs/. `overrides`: config keys
    replaced in ck.cfg. `trust`: allow the full unpickler (or KERPLE_TRUST_CHECKPOINT=1; safe_load.py).
    `dtype`: cast NeoX weights to it (None: fp32); ours keep their stored dtype.
    `allow_nonfinite`: accept NaN/inf tensors (finite.py)."""
    tag_dir = tag_dir_of(ckpt_dir, tag)
    check_step(tag_dir)  # the manifest: no missing, changed or foreign file, the config still the weights'
    layout = detect_layout(tag_dir)
    if is_neox(layout):
        state, client, cfg, _ = read_neox_state(tag_dir, layout, config, overrides, trust,
                                                dtype or torch.float32, allow_nonfinite)
        return Tp1Checkpoint(state, client, cfg, tag_dir, layout)
    state, client = _read_ours(tag_dir, layout, trust, allow_nonfinite)
    return Tp1Checkpoint(state, client, _our_config(tag_dir, overrides), tag_dir, layout)


def _read_ours(tag_dir: str, layout: str, trust: bool, allow_nonfinite: bool) -> tuple[dict, dict]:
    def read(p: str) -> dict:
        return safe_load.read_checkpoint_file(p, trust, allow_nonfinite)

    if layout == "ours-zero3":
        return _read_zero3(tag_dir, trust, allow_nonfinite)
    path = os.path.join(tag_dir, MODEL_FILE)
    if not os.path.isfile(path):
        raise CheckpointError(f"{path} is missing: {tag_dir} is not a complete sequential checkpoint")
    if layout == "ours-pipeline":  # pipeline engine: weights in layer files
        client = client_state(read(path))
        print(f"[checkpoint] read pipeline layer files of {tag_dir} into the sequential model", flush=True)
        return merge_pipeline_to_sequential(tag_dir, read), client
    if layout == "ours-tp":  # saved with tensor parallelism: merge to TP=1 in memory
        paths = shard_files(tag_dir)
        blobs = [read(p) for p in paths]
        _check_shard_count(tag_dir, blobs[0], len(paths))
        module, client = merge_blobs(blobs, tag_dir)
        print(f"[checkpoint] merged {len(paths)} tensor-parallel shards of {tag_dir} into TP=1", flush=True)
        return module, client
    blob = read(path)
    _check_shard_count(tag_dir, blob, 1)
    return blob["module"], client_state(blob)


def _check_shard_count(tag_dir: str, blob: dict, found: int) -> None:
    """Rank 0's saved model-parallel-size against the shards there (a step without a manifest:
    a missing mp_rank_XX would otherwise be merged into half of each split tensor)."""
    saved = (blob.get("args") or {}).get("model_parallel_size") if isinstance(blob.get("args"), dict) else None
    if isinstance(saved, int) and saved != found:
        missing = [f"mp_rank_{r:02d}_model_states.pt" for r in range(found, saved)]
        raise CheckpointError(f"checkpoint {tag_dir} was saved with model-parallel-size {saved} but holds {found} "
                              f"tensor-parallel shard file(s): {', '.join(missing) or 'the extra ones'} "
                              f"{'are' if len(missing) != 1 else 'is'} missing. Copy the missing file(s) from where "
                              "the step was saved, or load another step (--iteration N)")


def _read_zero3(tag_dir: str, trust: bool, allow_nonfinite: bool) -> tuple[dict, dict]:
    """ZeRO-3: the weights are partitioned over the optimizer files; DeepSpeed's zero_to_fp32
    consolidates them, with its reads routed through the safe reader."""
    # lazy: DeepSpeed (its import picks an accelerator), only for a ZeRO-3 checkpoint
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    client = client_state(safe_load.read_checkpoint_file(zero3_model_files(tag_dir)[0], trust, allow_nonfinite))
    print(f"[checkpoint] consolidated the ZeRO-3 partitions of {tag_dir}", flush=True)
    ckpt_dir, tag = os.path.split(os.path.normpath(tag_dir))
    ckpt_dir = ckpt_dir or "."
    try:
        with safe_zero_to_fp32(trust, allow_nonfinite, tag_dir=tag_dir):
            state = get_fp32_state_dict_from_zero_checkpoint(ckpt_dir, tag=tag)
    except UserError:  # refused by the safe reader (unsafe, non-finite, missing): its message names the file
        raise
    except Exception as e:  # a missing or truncated optimizer partition
        raise CheckpointError(f"could not consolidate ZeRO-3 checkpoint {tag_dir}: {e}") from e
    return dict(state), client


def _our_config(tag_dir: str, overrides: dict | None):
    """resolved_config.yml with TP=1 (the reader merged any shards) and `overrides`; None if absent."""
    resolved = os.path.join(tag_dir, RESOLVED_CONFIG)
    if not os.path.isfile(resolved):
        return None

    cfg = NeoXConfig.from_file(resolved)
    if cfg.parallel.model_parallel_size != 1:
        overrides = {"model_parallel_size": 1, **(overrides or {})}
    if not overrides:
        return cfg
    new = cfg.replace(**overrides)
    refuse_shape_change(tag_dir, {k: getattr(cfg.model, k) for k in CHECKED_ARGS},
                        {k: getattr(new.model, k) for k in CHECKED_ARGS},
                        "Drop those -o overrides: a checkpoint is loaded as the model it was trained as", label="-o")
    return new
