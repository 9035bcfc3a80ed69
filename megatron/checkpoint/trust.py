"""The trust switches every CLI that reads checkpoints takes (--trust-checkpoint, --allow-nonfinite).

Apart from safe_load.py, which imports torch: a CLI declares these flags while it parses its
arguments, and a mistyped flag must be answered before torch loads (~1 s warm, 8-13 s cold).
"""
from __future__ import annotations

import os

TRUST_ENV = "KERPLE_TRUST_CHECKPOINT"
TRUST_HINT = (f"if you trust where it came from, pass --trust-checkpoint (evaluate.py, generate.py, train.py, "
              f"deepy.py, tools/export_hf.py, tools/convert_neox_checkpoint.py, tools/merge_tp_checkpoint.py) or "
              f"set {TRUST_ENV}=1")


def add_trust_flag(parser) -> None:
    parser.add_argument("--trust-checkpoint", action="store_true",
                        help="read checkpoint files with the full (code-executing) unpickler when safe loading "
                             f"(weights_only=True) refuses them; only for files you trust (same as {TRUST_ENV}=1)")


def add_load_flags(parser) -> None:
    """--trust-checkpoint and --allow-nonfinite, the same on every CLI that reads checkpoints."""
    add_trust_flag(parser)
    parser.add_argument("--allow-nonfinite", action="store_true",
                        help="load a checkpoint even when its tensors hold NaN/inf (refused by default)")


def apply_trust_flag(args) -> None:
    """--trust-checkpoint -> KERPLE_TRUST_CHECKPOINT=1, so every reader (and child process) sees it."""
    if getattr(args, "trust_checkpoint", False):
        os.environ[TRUST_ENV] = "1"


def trusted_from_env() -> bool:
    return os.environ.get(TRUST_ENV, "").strip().lower() in ("1", "true", "yes")
