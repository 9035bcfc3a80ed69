"""This stack's tensor-parallel checkpoint -> TP=1: the module state dicts of every mp_rank_XX file
of one step merged (rules in megatron/parallel/merge.py), and the client state made to say TP=1.

The optimizer state is not merged (it is sharded the same way, and evaluation does not need it):
a merged checkpoint is for evaluation, export, or a fine-tune start (`finetune: true`)."""
from __future__ import annotations

from megatron.checkpoint.client import client_state
from megatron.checkpoint.errors import CheckpointError
from megatron.parallel.merge import merge_state_dicts


def merge_blobs(blobs: list[dict], where: str) -> tuple[dict, dict]:
    """Per-rank checkpoint dicts -> (TP=1 module state dict, client state saying TP=1)."""
    client = client_state(blobs[0])
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
