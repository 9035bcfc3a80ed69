"""Every checkpoint file, ours included, is read here: PyTorch's restricted unpickler + an allow-list.

A full unpickle runs whatever code the file names, so a crafted `mp_rank_00_model_states.pt` (ours
or anyone's) would run code in evaluate.py, generate.py, tools/* and training's `load:`. Files are
therefore read with PyTorch's restricted unpickler. Besides tensors, checkpoints hold plain python
and numpy objects (numpy RNG state, argparse Namespace in older Megatron, sets of module names) and,
in DeepSpeed's ZeRO optimizer files, a few DeepSpeed classes; the ones that are data only (no code
runs when they are rebuilt: object.__new__ plus a __dict__ update, or an int Enum) are allow-listed
below. Anything else is refused with an error that names the file and the switch that allows the
full unpickler: `--trust-checkpoint` on the CLIs, or KERPLE_TRUST_CHECKPOINT=1 in the environment
(train.py / deepy.py). After reading, the tensors are checked for NaN/inf (finite.py).
"""
from __future__ import annotations

import argparse
import importlib
import os
import pickle
import re
import sys
import zipfile

import numpy as np
import torch
from numpy._core.multiarray import _reconstruct

from megatron.checkpoint.digest import ZIP_MAGIC
from megatron.checkpoint.errors import CheckpointError, UnsafeCheckpointError
from megatron.checkpoint.finite import check_finite
from megatron.checkpoint.layout import malformed
from megatron.checkpoint.manifest import verify_file
from megatron.checkpoint.trust import TRUST_HINT, trusted_from_env

# Data-only DeepSpeed classes its ZeRO/fp16 optimizer files contain (checked by saving real
# checkpoints through the Trainer: tests/integration/test_checkpoint_safety.py). Named, not
# imported: importing deepspeed costs evaluate.py a second, and only optimizer files need them.
DEEPSPEED_GLOBALS = (
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",  # optimizer_state_dict.loss_scaler (fp32/bf16)
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",  # the same with fp16 dynamic scaling
    "deepspeed.runtime.zero.config.ZeroStageEnum",  # optimizer_state_dict.zero_stage (an int Enum)
    "deepspeed.utils.tensor_fragment.fragment_address",  # ZeRO-1/2 param_slice_mappings (numel, start)
)


def _numpy_globals() -> list:
    """numpy pieces of a pickled RNG state / array, under both numpy 1.x and 2.x module names."""
    out = [_reconstruct, np.ndarray, np.dtype, (_reconstruct, "numpy.core.multiarray._reconstruct")]
    for name in ("UInt32DType", "Int64DType", "Int32DType", "Float64DType", "Float32DType",
                 "BoolDType", "UInt8DType", "Float16DType"):
        cls = getattr(np.dtypes, name, None)
        if cls is not None:
            out.append(cls)
    return out


def _resolve(dotted: str):
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _deepspeed_globals(import_them: bool) -> list:
    """The DeepSpeed allow-list entries; without `import_them`, only those already imported."""
    return [_resolve(d) for d in DEEPSPEED_GLOBALS
            if import_them or d.rpartition(".")[0] in sys.modules]


def allowed_globals(with_deepspeed: bool = False) -> list:
    return [argparse.Namespace, set, frozenset, *_numpy_globals(), *_deepspeed_globals(with_deepspeed)]


def _refused_global(message: str) -> str | None:
    m = re.search(r"GLOBAL ([\w.]+)", message)
    return m.group(1) if m else None


def _describe_refusal(message: str) -> str:
    """'it contains x.y' from torch's long 'Unsupported global: GLOBAL x.y ...' message."""
    name = _refused_global(message)
    if name:
        return f"it contains {name}"
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    return (lines or ["unknown object"])[-1][:200]


# torch.save's legacy (non-zip) format starts with this number, pickled (protocol 2 by default)
_LEGACY_MAGIC = (0x1950A86A20F9469CFC6C).to_bytes(10, "little")
NOT_A_CHECKPOINT_FIX = ("a step's .pt files are the ones torch.save wrote when it was saved: copy the step again "
                        "from where it was saved, or load another step (--iteration N / `iteration: N`)")


def not_a_torch_file(path: str) -> str | None:
    """Why `path` cannot be a file torch.save wrote (what it looks like instead), or None. Only its
    first bytes and, for a zip, its directory are read. A damaged torch file passes: torch.load
    then names the damage."""
    with open(path, "rb") as f:
        head = f.read(64)
    if not head:
        return "it is empty"
    if head.startswith(ZIP_MAGIC):
        try:
            with zipfile.ZipFile(path) as zf:
                names = zf.namelist()
        except (zipfile.BadZipFile, OSError, EOFError, ValueError):
            return None  # a torch file cut short: torch.load's error says so
        return None if any(n.endswith("data.pkl") for n in names) else "a zip archive without torch's data.pkl"
    if _LEGACY_MAGIC in head:
        return None
    if head.startswith(b"\x80"):
        return "a plain pickle, not one torch.save wrote"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 3 or b"\x00" in head:  # not just a character cut at byte 64
            return f"binary data starting with bytes {head[:8].hex(' ')}"
        text = head[:e.start].decode("utf-8")
    return f"a text file starting with {text[:40]!r}"


def _restricted_load(path: str, **kwargs):
    """weights_only=True with the allow-list; DeepSpeed's classes are imported when a file needs them."""
    try:
        with torch.serialization.safe_globals(allowed_globals()):
            return torch.load(path, weights_only=True, **kwargs)
    except pickle.UnpicklingError as e:
        if _refused_global(str(e)) not in DEEPSPEED_GLOBALS:
            raise
    with torch.serialization.safe_globals(allowed_globals(with_deepspeed=True)):
        return torch.load(path, weights_only=True, **kwargs)


def safe_torch_load(path: str, trust: bool = False, map_location="cpu", **kwargs):
    """The object in `path`, read with weights_only=True (plus the allow-list) unless `trust`
    (or KERPLE_TRUST_CHECKPOINT=1). kwargs: torch.load's (mmap=...)."""
    kwargs.pop("weights_only", None)  # DeepSpeed asks for the full unpickler: only `trust` gives it
    if not os.path.isfile(path):
        raise CheckpointError(f"{path} is missing: the checkpoint directory is incomplete")
    verify_file(path)  # against the step's manifest, when it has one
    not_torch = not_a_torch_file(path)
    if not_torch:  # no unpickler, trusted or not, reads it: never advise --trust-checkpoint
        raise CheckpointError(f"{path} is not a PyTorch checkpoint file ({not_torch}); {NOT_A_CHECKPOINT_FIX}")
    trust = trust or trusted_from_env()
    try:
        if trust:  # the one full unpickler, behind the explicit trust switch
            return torch.load(path, map_location=map_location, weights_only=False, **kwargs)
        return _restricted_load(path, map_location=map_location, **kwargs)
    except pickle.UnpicklingError as e:
        if trust or "weights only load failed" not in str(e).lower():
            raise CheckpointError(f"could not read {path}: {e}; the file is truncated or corrupt") from e
        if _refused_global(str(e)) is None:  # no class refused: the pickle itself is damaged or unusual
            raise CheckpointError(
                f"could not read {path}: safe loading stopped at {_describe_refusal(str(e))}: the file is damaged "
                f"(copy it again from where it was saved); only if it is intact and comes from a source you trust "
                f"(a pickle protocol safe loading does not read): {TRUST_HINT}") from e
        raise UnsafeCheckpointError(
            f"{path} holds python objects that safe loading (torch.load weights_only=True) refuses "
            f"({_describe_refusal(str(e))}); {TRUST_HINT}") from e
    except FileNotFoundError as e:  # removed between the check and the read
        raise CheckpointError(f"{path} is missing: the checkpoint directory is incomplete") from e
    except (EOFError, RuntimeError, OSError) as e:  # truncated zip / short read
        raise CheckpointError(f"could not read {path}: {e}; the file is truncated or corrupt "
                              "(re-copy or re-download it)") from e


def read_checkpoint_file(path: str, trust: bool = False, allow_nonfinite: bool = False, map_location="cpu",
                         **kwargs):
    """safe_torch_load, then the NaN/inf check of every tensor in it: how every checkpoint file is read."""
    obj = safe_torch_load(path, trust, map_location, **kwargs)
    problem = malformed(obj, path)
    if problem:
        raise CheckpointError(f"{path} is a torch file but not a checkpoint file: {problem}; {NOT_A_CHECKPOINT_FIX}")
    check_finite(obj, path, allow_nonfinite)
    return obj
