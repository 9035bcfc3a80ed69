"""DeepSpeed's checkpoint reads, routed through our safe loader.

`engine.load_checkpoint` reads every file (model states, ZeRO optimizer partitions, pipeline layer
files) through `engine.checkpoint_engine.load`, which unpickles fully (weights_only off): a crafted
file runs code. `install_safe_loading` wraps whatever checkpoint engine DeepSpeed built: saving is
unchanged, every load goes through megatron/checkpoint/safe_load.read_checkpoint_file (weights_only=True
+ allow-list, the full unpickler only when trusted, then the NaN/inf check).

Why a wrapped engine rather than validating every file with the safe loader first and then letting
DeepSpeed unpickle it fully: validation would have to predict exactly which files DeepSpeed opens
(it differs per ZeRO stage, precision, pipeline and DeepSpeed version; a file it reads that we did
not predict would be unpickled unchecked), every file would be read twice, and the file that is
unpickled is not the one that was checked if it changes in between. The wrapper checks the very
object DeepSpeed uses, in the one read it makes.

Two DeepSpeed paths bypass the checkpoint engine: ZeRO-3 without optimizer states (`finetune` /
`no-load-optim`) consolidates through deepspeed.utils.zero_to_fp32, which calls torch.load itself
(`safe_zero_to_fp32` routes it through the same reader while it runs), and universal checkpoints
(refused unless trusted, see Checkpointer.load).

It lives in megatron/checkpoint/ rather than training/ because the engine-free reader needs it too:
reader.py consolidates a ZeRO-3 checkpoint for evaluation through `safe_zero_to_fp32`, and this
package must not import training/. It imports no DeepSpeed at module level.
"""
from __future__ import annotations

import contextlib
import os

import torch

from megatron.checkpoint import safe_load
from megatron.checkpoint.errors import CheckpointError


def _check_inside(path: str, tag_dir: str | None) -> str:
    """`path` when it lies inside the step being loaded. DeepSpeed's ZeRO-3 path without optimizer
    states reads the step `latest` names whatever tag it was given: refuse that mix-up loudly."""
    path = str(path)
    if tag_dir is not None:
        root = os.path.realpath(tag_dir)
        if not os.path.realpath(path).startswith(root + os.sep):
            raise CheckpointError(f"DeepSpeed went to read {path}, outside the checkpoint being loaded ({tag_dir}); "
                                  "with ZeRO-3 and finetune / no-load-optim it loads the step `latest` names: point "
                                  "`latest` at the step you want, or leave `iteration:` unset")
    return path


class SafeLoadingCheckpointEngine:
    """A DeepSpeed checkpoint engine whose `load` is our safe reader; everything else delegates."""

    def __init__(self, inner, trust: bool = False, allow_nonfinite: bool = False, tag_dir: str | None = None):
        self.inner = inner
        self.trust = trust
        self.allow_nonfinite = allow_nonfinite
        self.tag_dir = tag_dir

    def load(self, path: str, map_location=None):
        return safe_load.read_checkpoint_file(_check_inside(path, self.tag_dir), self.trust, self.allow_nonfinite,
                                    map_location or "cpu")

    def __getattr__(self, name):  # save, create, commit, makedirs, ... stay DeepSpeed's
        return getattr(self.inner, name)


def install_safe_loading(engine, trust: bool = False, allow_nonfinite: bool = False,
                         tag_dir: str | None = None) -> None:
    """Make every checkpoint read of `engine` (and of its pipeline module) go through the safe reader;
    with `tag_dir`, only files inside that step directory may be read."""
    inner = engine.checkpoint_engine
    if isinstance(inner, SafeLoadingCheckpointEngine):
        inner = inner.inner
    engine.checkpoint_engine = SafeLoadingCheckpointEngine(inner, trust, allow_nonfinite, tag_dir)


class _TorchWithSafeLoad:
    """The `torch` module as zero_to_fp32 sees it while `safe_zero_to_fp32` is active."""

    def __init__(self, load):
        self.load = load

    def __getattr__(self, name):
        return getattr(torch, name)


@contextlib.contextmanager
def safe_zero_to_fp32(trust: bool = False, allow_nonfinite: bool = False, tag_dir: str | None = None):
    """While active, deepspeed.utils.zero_to_fp32 reads its files with the safe reader.

    zero_to_fp32 unpickles fully itself (no checkpoint engine, weights_only off); its module
    global `torch` is swapped for a proxy whose `load` is ours, and restored on exit."""
    from deepspeed.utils import zero_to_fp32  # lazy: DeepSpeed (its import picks an accelerator), only for a ZeRO-3 checkpoint

    def load(path, map_location=None, **kwargs):
        return safe_load.read_checkpoint_file(_check_inside(path, tag_dir), trust, allow_nonfinite, map_location or "cpu",
                                    **kwargs)

    saved = zero_to_fp32.torch
    zero_to_fp32.torch = _TorchWithSafeLoad(load)
    try:
        yield
    finally:
        zero_to_fp32.torch = saved
