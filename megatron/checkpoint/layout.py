"""Which layout a checkpoint step directory is in (decided here and nowhere else), and its files.

    ours            resolved_config.yml + mp_rank_00_model_states.pt (module + client state)
    ours-tp         the same split over mp_rank_00 .. mp_rank_XX (tensor parallelism)
    ours-pipeline   mp_rank_00 (client state) + layer_XX-model_00-model_states.pt (DeepSpeed pipeline)
    ours-zero3      *zero_pp_rank_*_mp_rank_00_model_states.pt: weights partitioned over the
                    optimizer files (ZeRO stage 3), no mp_rank_00_model_states.pt
    neox-pipeline   no resolved_config.yml; layer_XX-model_YY-model_states.pt files + mp_rank_XX
                    (module None): the 2022 KERPLE / DeeperSpeed PipelineModule layout
    neox-sequential no resolved_config.yml; mp_rank_XX_model_states.pt whose `module` holds
                    `sequential.<idx>.<param>` (current NeoX with pipe-parallel-size 0)
"""
from __future__ import annotations

import fnmatch
import glob
import os
import re

from megatron.checkpoint.errors import CheckpointError

MODEL_FILE = "mp_rank_00_model_states.pt"  # rank 0's module + client state
RESOLVED_CONFIG = "resolved_config.yml"  # written by this stack's Checkpointer only
CONFIGS_DIR = "configs"  # the original YAML files (NeoX and ours)
_SHARD = re.compile(r"mp_rank_(\d+)_model_states\.pt")
_LAYER_FILE = re.compile(r"layer_(\d+)-model_(\d+)-model_states\.pt")
_ZERO3_GLOB = "*zero_pp_rank_*_mp_rank_00_model_states.pt"

DESCRIPTIONS = {
    "ours": "this stack's layout",
    "ours-tp": "this stack's tensor-parallel shards",
    "ours-pipeline": "this stack's pipeline layer files",
    "ours-zero3": "this stack's ZeRO-3 partitions",
    "neox-pipeline": "NeoX pipeline layer files (the 2022 KERPLE layout)",
    "neox-sequential": "NeoX sequential layout (mp_rank_XX module 'sequential.<idx>.*')",
}


def is_neox(layout: str) -> bool:
    """A NeoX / KERPLE checkpoint (weights only for us: its optimizer state is another codebase's)."""
    return layout.startswith("neox-")


def detect_layout(tag_dir: str) -> str:
    """One of DESCRIPTIONS' keys (see the module docstring). A directory with nothing recognisable
    is 'ours', so the reader names the file it misses."""
    if not os.path.isfile(os.path.join(tag_dir, RESOLVED_CONFIG)):
        if layer_files(tag_dir):
            return "neox-pipeline"
        if shard_files(tag_dir):
            return "neox-sequential"
    if not os.path.isfile(os.path.join(tag_dir, MODEL_FILE)):
        return "ours-zero3" if zero3_model_files(tag_dir) else "ours"
    if layer_files(tag_dir):
        return "ours-pipeline"
    return "ours-tp" if len(shard_files(tag_dir)) > 1 else "ours"


def shard_files(tag_dir: str) -> list[str]:
    """The mp_rank_XX_model_states.pt files of one step, in rank order (0..N-1, no gap)."""
    ranks = sorted(int(m.group(1)) for f in os.listdir(tag_dir) if (m := _SHARD.fullmatch(f)))
    if ranks != list(range(len(ranks))):
        raise CheckpointError(f"{tag_dir} holds tensor-parallel shards {ranks}; expected mp_rank_00 .. "
                              f"mp_rank_{len(ranks) - 1:02d} with none missing")
    return [os.path.join(tag_dir, f"mp_rank_{r:02d}_model_states.pt") for r in ranks]


def layer_files(tag_dir: str) -> dict[tuple[int, int], str]:
    """{(tensor-parallel rank, NeoX layer index): path} of the pipeline layer files."""
    out = {}
    for path in glob.glob(os.path.join(tag_dir, "layer_*-model_*-model_states.pt")):
        m = _LAYER_FILE.fullmatch(os.path.basename(path))
        if m:
            out[(int(m.group(2)), int(m.group(1)))] = path
    return out


def zero3_model_files(tag_dir: str) -> list[str]:
    """ZeRO-3's per-rank model-state files (client state; the weights are in the optimizer files)."""
    return sorted(glob.glob(os.path.join(tag_dir, _ZERO3_GLOB)))


def config_files(tag_dir: str) -> list[str]:
    """The YAML files NeoX copies into global_stepN/configs/ (merged in name order)."""
    found = (glob.glob(os.path.join(tag_dir, CONFIGS_DIR, "*.yml"))
             + glob.glob(os.path.join(tag_dir, CONFIGS_DIR, "*.yaml")))
    return sorted(found)


def malformed(obj, path: str) -> str | None:
    """What keeps `obj`, unpickled from `path`, from being the checkpoint file its name says, or
    None: every file DeepSpeed and NeoX write holds a dict, and a model-states file (mp_rank_XX or
    ZeRO's *_mp_rank_XX_model_states.pt) a dict with `module` (None in pipeline and ZeRO-3 steps)."""
    if not isinstance(obj, dict):
        return f"it holds a {type(obj).__name__}, not the dict torch.save writes for a checkpoint file"
    name = os.path.basename(path)
    if (_SHARD.fullmatch(name) or fnmatch.fnmatch(name, _ZERO3_GLOB)) and "module" not in obj:
        shown = ", ".join(repr(k) for k in list(obj)[:6]) + (", ..." if len(obj) > 6 else "")
        return f"it has no `module` entry (its keys: {shown or 'none'}), so it is not a model-states file"
    return None
