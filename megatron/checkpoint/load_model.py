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

from megatron.checkpoint.compat import strict_load_error
from megatron.checkpoint.errors import CheckpointError
from megatron.checkpoint.reader import read_tp1_state
from megatron.checkpoint.tags import read_latest, resolve_tag
from megatron.checkpoint.trust import trusted_from_env
from megatron.device import resolve_device
from megatron.errors import UserError
from megatron.model import GPTModel

LOAD_ATTEMPTS = 3


def load_checkpoint_model(ckpt_dir: str, tag: str | None = None, overrides: dict | None = None,
                          device: str | torch.device = "cpu", allow_nonfinite: bool = False):
    """Returns (model in eval mode, resolved config, client state).

    Every layout megatron/checkpoint/reader.py accepts (ours, TP shards, pipeline layer files,
    ZeRO-3, NeoX / KERPLE 2022) loads; a merged or foreign one prints one line naming its layout.
    `tag` None: the step `latest` names (see the module docstring). allow_nonfinite: accept
    NaN/inf weights (refused by default, megatron/checkpoint/finite.py). device: as `--device`
    (megatron/device.py), `auto` included."""
    device = resolve_device(device)
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
    ck = read_tp1_state(ckpt_dir, tag, overrides=overrides, trust=trusted_from_env(), allow_nonfinite=allow_nonfinite)
    if ck.cfg is None:
        raise CheckpointError(f"{os.path.join(ck.tag_dir, 'resolved_config.yml')} is missing: {ck.tag_dir} was not "
                              "written by this stack's train.py")
    if ck.vocab_size is None:
        raise CheckpointError(f"{ck.tag_dir}: client state lacks args.padded_vocab_size")
    model = GPTModel(ck.cfg.model, ck.vocab_size)
    try:
        missing, unexpected = model.load_state_dict(ck.state, strict=False)
    except RuntimeError as e:  # a shape differs (an -o override of a model key): one message
        err = strict_load_error(e, ck.tag_dir)
        if err is None:
            raise
        raise err from e
    if missing or unexpected:
        raise CheckpointError(f"{ck.tag_dir}: weights do not match the model built from its config: "
                              f"missing {sorted(missing)[:8]}, unexpected {sorted(unexpected)[:8]}")
    return model.to(device).eval(), ck.cfg, ck.client


def config_checkpoint(cfg) -> str:
    """The checkpoint directory a training config names for evaluation (`deepy.py eval.py` and
    `deepy.py evaluate.py`): its `load`, else its `save` (where its training wrote)."""
    load = cfg.checkpoint.load or cfg.checkpoint.save
    if not load:
        raise UserError("the config sets no `load` (nor `save`): set load to the checkpoint directory to "
                        "evaluate (-o load=DIR), or give evaluate.py the checkpoint itself (--checkpoint DIR)")
    if not os.path.isdir(load):
        raise UserError(f"load {load!r} is not a directory: no checkpoint to evaluate; train first "
                        "(python deepy.py train.py CONFIG.yml) or point `load` at a checkpoint directory")
    return load
