"""Which layout a checkpoint step directory is in, and how its files are found.

    ours            resolved_config.yml present (written by this stack's train.py)
    neox-pipeline   layer_XX-model_YY-model_states.pt files + mp_rank_XX (module None):
                    the 2022 KERPLE / DeeperSpeed PipelineModule layout (pipe-parallel-size >= 1)
    neox-sequential mp_rank_XX_model_states.pt whose `module` holds `sequential.<idx>.<param>`
                    (current NeoX with pipe-parallel-size 0)
"""
from __future__ import annotations

import glob
import os
import re

LAYER_FILE = re.compile(r"layer_(\d+)-model_(\d+)-model_states\.pt")

DESCRIPTIONS = {
    "neox-pipeline": "NeoX pipeline layer files (the 2022 KERPLE layout)",
    "neox-sequential": "NeoX sequential layout (mp_rank_XX module 'sequential.<idx>.*')",
}


def tag_dir_of(ckpt_dir: str, tag: str | None = None) -> str:
    """global_stepN directory named by `tag` or by `latest` (a plain name inside ckpt_dir, see
    megatron/training/checkpoint_latest.py); clear errors when either is missing or invalid."""
    from megatron.training.checkpoint import CheckpointError
    from megatron.training.checkpoint_latest import resolve_tag

    path = os.path.join(ckpt_dir, resolve_tag(ckpt_dir, tag))
    if not os.path.isdir(path):
        raise CheckpointError(f"{path} does not exist: `latest` (or --iteration) names a missing step; "
                              "fix `latest` or pass --iteration of an existing global_step directory")
    return path


def detect_layout(tag_dir: str) -> str:
    """'ours', 'neox-pipeline' or 'neox-sequential' (see the module docstring)."""
    if os.path.isfile(os.path.join(tag_dir, "resolved_config.yml")):
        return "ours"
    if layer_files(tag_dir):
        return "neox-pipeline"
    if mp_files(tag_dir):
        return "neox-sequential"
    return "ours"  # nothing recognisable: let our loader give its own error


def foreign_layout(ckpt_dir: str, tag: str | None = None) -> str | None:
    """The NeoX layout of ckpt_dir's step, or None for ours / anything unreadable (the caller's
    own loader then reports the problem)."""
    try:
        layout = detect_layout(tag_dir_of(ckpt_dir, tag))
    except ValueError:
        return None
    return None if layout == "ours" else layout


def layer_files(tag_dir: str) -> dict[tuple[int, int], str]:
    """{(tp rank, NeoX layer index): path}."""
    out = {}
    for path in glob.glob(os.path.join(tag_dir, "layer_*-model_*-model_states.pt")):
        m = LAYER_FILE.fullmatch(os.path.basename(path))
        if m:
            out[(int(m.group(2)), int(m.group(1)))] = path
    return out


def mp_files(tag_dir: str) -> list[str]:
    """mp_rank_XX_model_states.pt in rank order; error when a rank is missing."""
    from megatron.parallel.merge_checkpoint import shard_files

    return shard_files(tag_dir)


def config_files(tag_dir: str) -> list[str]:
    """The YAML files NeoX copies into global_stepN/configs/ (merged in name order)."""
    found = glob.glob(os.path.join(tag_dir, "configs", "*.yml")) + glob.glob(os.path.join(tag_dir, "configs", "*.yaml"))
    return sorted(found)
