"""torch.load for checkpoints written elsewhere: weights_only=True first.

A full unpickle of a foreign file can run arbitrary code, so files we did not write are read with
PyTorch's restricted unpickler. DeepSpeed/NeoX model-state files also hold plain python and numpy
objects (numpy RNG state, argparse Namespace in older Megatron, sets of module names); the ones
known to be data only are allow-listed below. Anything else is refused with an error that names
the file and the switch that allows the full unpickler: `--trust-checkpoint` on our tools, or
KERPLE_TRUST_CHECKPOINT=1 in the environment (train.py / evaluate.py).
"""
from __future__ import annotations

import argparse
import os
import pickle
import re

import numpy as np
import torch

from megatron.errors import UserError

TRUST_ENV = "KERPLE_TRUST_CHECKPOINT"
TRUST_HINT = (f"if you trust where it came from, pass --trust-checkpoint (generate.py, "
              f"tools/convert_neox_checkpoint.py, tools/export_hf.py) or set {TRUST_ENV}=1")


class UnsafeCheckpointError(UserError):
    pass


def _numpy_globals() -> list:
    """numpy pieces of a pickled RNG state / array, under both numpy 1.x and 2.x module names."""
    from numpy._core.multiarray import _reconstruct

    out = [_reconstruct, np.ndarray, np.dtype, (_reconstruct, "numpy.core.multiarray._reconstruct")]
    for name in ("UInt32DType", "Int64DType", "Int32DType", "Float64DType", "Float32DType",
                 "BoolDType", "UInt8DType", "Float16DType"):
        cls = getattr(np.dtypes, name, None)
        if cls is not None:
            out.append(cls)
    return out


def allowed_globals() -> list:
    return [argparse.Namespace, set, frozenset, *_numpy_globals()]


def _refused_global(message: str) -> str:
    """'it contains x.y' from torch's long 'Unsupported global: GLOBAL x.y ...' message."""
    m = re.search(r"GLOBAL ([\w.]+)", message)
    if m:
        return f"it contains {m.group(1)}"
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    return (lines or ["unknown object"])[-1][:200]


def trusted_from_env() -> bool:
    return os.environ.get(TRUST_ENV, "").strip().lower() in ("1", "true", "yes")


def safe_torch_load(path: str, trust: bool = False):
    """The object in `path`, read with weights_only=True (plus the allow-list) unless `trust`."""
    from megatron.training.checkpoint import CheckpointError

    if not os.path.isfile(path):
        raise CheckpointError(f"{path} is missing: the checkpoint directory is incomplete")
    trust = trust or trusted_from_env()
    try:
        if trust:
            return torch.load(path, map_location="cpu", weights_only=False)
        with torch.serialization.safe_globals(allowed_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if trust or "weights only load failed" not in str(e).lower():
            raise CheckpointError(f"could not read {path}: {e}; the file is truncated or corrupt") from e
        raise UnsafeCheckpointError(
            f"{path} holds python objects that safe loading (torch.load weights_only=True) refuses "
            f"({_refused_global(str(e))}); {TRUST_HINT}") from e
    except (EOFError, RuntimeError, OSError) as e:  # truncated zip / short read
        raise CheckpointError(f"could not read {path}: {e}; the file is truncated or corrupt "
                              "(re-copy or re-download it)") from e
