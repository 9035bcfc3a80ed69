"""Tensor-parallel checkpoint -> TP=1: read every mp_rank_XX file of one step, merge the module
state dicts (rules in megatron/parallel/merge.py), and optionally write a TP=1 checkpoint in our
layout (latest, global_stepN/mp_rank_00_model_states.pt, resolved_config.yml, configs/).

The optimizer state is not merged (it is sharded the same way, and evaluation does not need it):
the merged checkpoint is for evaluation, export, or a fine-tune start (`finetune: true`)."""
from __future__ import annotations

import os
import re
import shutil

from megatron.parallel.merge import merge_state_dicts

SHARD = re.compile(r"mp_rank_(\d+)_model_states\.pt")


def shard_files(tag_dir: str) -> list[str]:
    """The mp_rank_XX_model_states.pt files of one step, in rank order (0..N-1, no gap)."""
    from megatron.training.checkpoint import CheckpointError

    ranks = sorted(int(m.group(1)) for f in os.listdir(tag_dir) if (m := SHARD.fullmatch(f)))
    if ranks != list(range(len(ranks))):
        raise CheckpointError(f"{tag_dir} holds tensor-parallel shards {ranks}; expected mp_rank_00 .. "
                              f"mp_rank_{len(ranks) - 1:02d} with none missing")
    return [os.path.join(tag_dir, f"mp_rank_{r:02d}_model_states.pt") for r in ranks]


def merge_blobs(blobs: list[dict], where: str) -> tuple[dict, dict]:
    """Per-rank checkpoint dicts -> (TP=1 module state dict, client state saying TP=1)."""
    from megatron.training.checkpoint import CheckpointError

    client = {k: v for k, v in blobs[0].items() if k not in ("module", "optimizer")}
    args = dict(client.get("args") or {})
    pos_emb = args.get("pos_emb") or (client.get("config") or {}).get("pos_emb")
    if pos_emb is None:
        raise CheckpointError(f"{where}: client state names no pos_emb; cannot tell how to merge position.*")
    try:
        module = merge_state_dicts([b["module"] for b in blobs], pos_emb)
    except ValueError as e:
        raise CheckpointError(f"{where}: cannot merge its tensor-parallel shards: {e}") from e
    args["model_parallel_size"] = 1
    client["args"] = args
    client["mp_world_size"] = 1
    if isinstance(client.get("config"), dict):
        client["config"] = {**client["config"], "model_parallel_size": 1}
    return module, client


def load_merged(paths: list[str], read) -> tuple[dict, dict]:
    """Read the shard files with `read(path) -> dict` and merge them in memory, saying so."""
    tag_dir = os.path.dirname(paths[0])
    module, client = merge_blobs([read(p) for p in paths], tag_dir)
    print(f"[checkpoint] merged {len(paths)} tensor-parallel shards of {tag_dir} into TP=1", flush=True)
    return module, client


def write_merged_checkpoint(input_dir: str, output_dir: str, iteration: int | None = None,
                            allow_nonfinite: bool = False) -> str:
    """Write the TP=1 version of a (TP>1) checkpoint to output_dir; returns its step directory."""
    from megatron.config import NeoXConfig
    from megatron.training.checkpoint import CheckpointError, load_model_state, tag_for, torch_save_file
    from megatron.training.checkpoint_latest import write_latest

    module, client, tag_dir = load_model_state(input_dir, tag_for(iteration) if iteration is not None else None,
                                               allow_nonfinite)
    tag = os.path.basename(os.path.normpath(tag_dir))
    out = os.path.join(output_dir, tag)
    if os.path.abspath(out) == os.path.abspath(tag_dir):
        raise CheckpointError("--output must differ from --input: the merge never overwrites the shards")
    os.makedirs(out, exist_ok=True)
    torch_save_file({**client, "module": module, "optimizer": None}, os.path.join(out, "mp_rank_00_model_states.pt"))
    if os.path.isdir(os.path.join(tag_dir, "configs")):
        shutil.copytree(os.path.join(tag_dir, "configs"), os.path.join(out, "configs"), dirs_exist_ok=True)
    resolved = os.path.join(tag_dir, "resolved_config.yml")
    if os.path.isfile(resolved):
        cfg = NeoXConfig.from_file(resolved)
        cfg.replace(model_parallel_size=1).save(os.path.join(out, "resolved_config.yml"),
                                                header=f"merged to TP=1 from {tag_dir}")
    write_latest(output_dir, tag)  # last: never names a partial directory
    return out
