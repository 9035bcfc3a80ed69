"""Refuse checkpoints whose tensors hold NaN or inf.

A run that diverged saves NaN weights; loaded again they evaluate to `nan` and a resumed run saves
them once more. Every checkpoint file is checked when it is read (weights and optimizer state: a
NaN Adam moment poisons the next step just the same), one torch.isfinite(t).all() per floating
tensor, and refused with the file and the first offending tensors named unless the caller allows
it (--allow-nonfinite on the CLIs, `allow-nonfinite-weights: true` for training's `load:`).
"""
from __future__ import annotations

import torch

from megatron.checkpoint.errors import CheckpointError

ALLOW_HINT = ("load an earlier step (--iteration / `iteration:`), or, to inspect it anyway, pass "
              "--allow-nonfinite (evaluate.py, generate.py, tools/*) or set `allow-nonfinite-weights: true` "
              "(training's `load:`)")
_SHOWN = 4  # offending tensors named in the message


def _tensors(obj, prefix: str = ""):
    """(dotted name, tensor) for every tensor nested in dicts, lists and tuples."""
    if isinstance(obj, torch.Tensor):
        yield prefix or "<tensor>", obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _tensors(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _tensors(v, f"{prefix}.{i}" if prefix else str(i))


def nonfinite_tensors(obj, limit: int | None = None) -> list[str]:
    """Names of the floating tensors in `obj` holding NaN or inf (the first `limit` of them)."""
    bad = []
    for name, t in _tensors(obj):
        if t.is_floating_point() and t.numel() and not bool(torch.isfinite(t).all()):
            bad.append(name)
            if limit is not None and len(bad) >= limit:
                break
    return bad


def check_finite(obj, where: str, allow: bool = False) -> None:
    """CheckpointError naming `where` (the file) and its first non-finite tensors, unless `allow`."""
    if allow:
        return
    bad = nonfinite_tensors(obj, _SHOWN + 1)
    if not bad:
        return
    more = ", ..." if len(bad) > _SHOWN else ""
    raise CheckpointError(f"{where} holds non-finite values (NaN or inf) in {', '.join(bad[:_SHOWN])}{more}: "
                          f"the run had diverged when it was saved; {ALLOW_HINT}")
