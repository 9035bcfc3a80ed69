"""Build a model from one of our checkpoints (no DeepSpeed engine, no optimizer).

The checkpoint directory may belong to a training run that is still saving into it: `latest` is
read ONCE per load and that tag is used for every file. When that step's directory disappears while
it is being read (the run saved a newer step and pruned this one: keep-last-n-checkpoints), `latest`
is read again and the newer step loaded, at most LOAD_ATTEMPTS times, with a message that says so
if the directory keeps changing.
"""
from __future__ import annotations

import os

import torch

from megatron.config import NeoXConfig
from megatron.errors import UserError
from megatron.model import GPTModel
from megatron.training.checkpoint import CheckpointError, load_model_state
from megatron.training.checkpoint_latest import read_latest, resolve_tag

LOAD_ATTEMPTS = 3


def load_checkpoint_model(ckpt_dir: str, tag: str | None = None, overrides: dict | None = None,
                          device: str | torch.device = "cpu", allow_nonfinite: bool = False):
    """Returns (model in eval mode, resolved config, client state).

    A NeoX / KERPLE checkpoint (no resolved_config.yml; pipeline layer files or a sequential
    module) is read through megatron/interop, which prints one line naming its layout.
    `tag` None: the step `latest` names (see the module docstring). allow_nonfinite: accept
    NaN/inf weights (refused by default, megatron/training/checkpoint_finite.py)."""
    if tag is not None:
        tag_dir = os.path.join(ckpt_dir, resolve_tag(ckpt_dir, tag))
        if not os.path.isdir(tag_dir):
            raise CheckpointError(f"{tag_dir} does not exist; pass --iteration of one of the global_step<N> "
                                  f"directories in {ckpt_dir}")
        try:
            return _load_tag(ckpt_dir, tag, overrides, device, allow_nonfinite)
        except (UserError, OSError) as e:
            if not os.path.isdir(tag_dir):
                raise CheckpointError(f"{os.path.join(ckpt_dir, tag)} was deleted while it was being read (a "
                                      "training run saving there prunes old steps: keep-last-n-checkpoints); "
                                      "name a step it keeps with --iteration") from e
            raise
    gone = []
    for _ in range(LOAD_ATTEMPTS):
        current = resolve_tag(ckpt_dir)
        try:
            return _load_tag(ckpt_dir, current, overrides, device, allow_nonfinite)
        except (UserError, OSError):
            if not _moved_on(ckpt_dir, current):
                raise  # the step is still there and still the latest: a real problem with its files
            gone.append(current)
    raise CheckpointError(
        f"{ckpt_dir}: the steps `latest` named ({', '.join(gone)}) were deleted while they were being read, "
        f"{LOAD_ATTEMPTS} times in a row: a training run is saving there and pruning old steps "
        "(keep-last-n-checkpoints); evaluate after it stops, name a step it keeps with --iteration, or raise "
        "keep-last-n-checkpoints")


def _moved_on(ckpt_dir: str, tag: str) -> bool:
    """True when `tag`'s directory is gone or `latest` now names another step (a concurrent save)."""
    if not os.path.isdir(os.path.join(ckpt_dir, tag)):
        return True
    try:
        return read_latest(ckpt_dir) != tag
    except CheckpointError:
        return False


def _load_tag(ckpt_dir: str, tag: str, overrides: dict | None, device, allow_nonfinite: bool):
    from megatron.interop.neox_layout import foreign_layout

    if foreign_layout(ckpt_dir, tag) is not None:
        from megatron.interop.neox_checkpoint import load_neox_model
        from megatron.interop.safe_load import trusted_from_env

        return load_neox_model(ckpt_dir, tag, overrides=overrides, trust=trusted_from_env(), device=device,
                               allow_nonfinite=allow_nonfinite)
    state, client, tag_dir = load_model_state(ckpt_dir, tag, allow_nonfinite)
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
