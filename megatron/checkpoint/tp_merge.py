"""This stack's tensor-parallel checkpoint -> TP=1: the module state dicts of every mp_rank_XX file
of one step merged (megatron/parallel/merge.py, by the plan of the model the saved config describes),
and the client state made to say TP=1.

The optimizer state is not merged (it is sharded the same way, and evaluation does not need it):
a merged checkpoint is for evaluation, export, or a fine-tune start (`finetune: true`)."""
from __future__ import annotations

import dataclasses

from megatron.checkpoint.client import client_state
from megatron.checkpoint.errors import CheckpointError
from megatron.config.model import ModelConfig
from megatron.parallel.merge import merge_state_dicts


def merge_blobs(blobs: list[dict], where: str) -> tuple[dict, dict]:
    """Per-rank checkpoint dicts -> (TP=1 module state dict, client state saying TP=1)."""
    client = client_state(blobs[0])
    args = dict(client.get("args") or {})
    try:
        module = merge_state_dicts([b["module"] for b in blobs], _model_source(client, args, where))
    except ValueError as e:
        raise CheckpointError(f"{where}: cannot merge its tensor-parallel shards: {e}") from e
    args["model_parallel_size"] = 1
    client["args"] = args
    client["mp_world_size"] = 1
    if isinstance(client.get("config"), dict):
        client["config"] = {**client["config"], "model_parallel_size": 1}
    return module, client


def _model_source(client: dict, args: dict, where: str):
    """What describes the saved model for the merge: the ModelConfig of the client state's flat
    config (every checkpoint our Checkpointer writes has one); else, for a client state with only
    args, its pos_emb (the merge then uses the scheme's reference model, any depth)."""
    flat = client.get("config")
    if isinstance(flat, dict) and all(flat.get(f.name) is not None for f in dataclasses.fields(ModelConfig)
                                      if f.metadata.get("required")):
        return ModelConfig(**{f.name: flat[f.name] for f in dataclasses.fields(ModelConfig) if f.name in flat})
    pos_emb = args.get("pos_emb") or (flat or {}).get("pos_emb")
    if pos_emb is None:
        raise CheckpointError(f"{where}: client state names no pos_emb; cannot tell how to merge position.*")
    return pos_emb
