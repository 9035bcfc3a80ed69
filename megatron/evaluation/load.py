"""Build a model from one of our checkpoints (no DeepSpeed engine, no optimizer)."""
from __future__ import annotations

import os

import torch

from megatron.config import NeoXConfig
from megatron.model import GPTModel
from megatron.training.checkpoint import CheckpointError, load_model_state


def load_checkpoint_model(ckpt_dir: str, tag: str | None = None, overrides: dict | None = None,
                          device: str | torch.device = "cpu"):
    """Returns (model in eval mode, resolved config, client state).

    A NeoX / KERPLE checkpoint (no resolved_config.yml; pipeline layer files or a sequential
    module) is read through megatron/interop, which prints one line naming its layout."""
    from megatron.interop.neox_layout import foreign_layout

    if foreign_layout(ckpt_dir, tag) is not None:
        from megatron.interop.neox_checkpoint import load_neox_model
        from megatron.interop.safe_load import trusted_from_env

        return load_neox_model(ckpt_dir, tag, overrides=overrides, trust=trusted_from_env(), device=device)
    state, client, tag_dir = load_model_state(ckpt_dir, tag)
    resolved = os.path.join(tag_dir, "resolved_config.yml")
    if not os.path.isfile(resolved):
        raise CheckpointError(f"{resolved} is missing: {tag_dir} was not written by this stack's train.py")
    cfg = NeoXConfig.from_file(resolved)
    if cfg.parallel.model_parallel_size != 1:  # the shards were merged to TP=1 by load_model_state
        overrides = {"model_parallel_size": 1, **(overrides or {})}
    if overrides:
        cfg = cfg.replace(**overrides)
    vocab = client.get("args", {}).get("padded_vocab_size")
    if vocab is None:
        raise CheckpointError(f"{tag_dir}: client state lacks args.padded_vocab_size")
    model = GPTModel(cfg.model, vocab)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(f"{tag_dir}: weights do not match the model built from its config: "
                              f"missing {sorted(missing)[:8]}, unexpected {sorted(unexpected)[:8]}")
    return model.to(device).eval(), cfg, client
