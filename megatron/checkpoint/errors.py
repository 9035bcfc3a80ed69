"""The checkpoint errors: one UserError family, so every CLI prints them as one line."""
from __future__ import annotations

from megatron.errors import EXIT_SYSTEM_ERROR, UserError


class CheckpointError(UserError):
    """A checkpoint that cannot be read as asked (missing, malformed, mismatched, unsafe)."""


class CheckpointSaveError(CheckpointError):
    """A save that could not be written (disk full, I/O error): the machine, not the input."""

    exit_code = EXIT_SYSTEM_ERROR


class UnsafeCheckpointError(CheckpointError):
    """A file safe loading refuses: only the explicit trust switch reads it."""
