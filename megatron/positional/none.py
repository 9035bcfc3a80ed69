"""No positional signal at all (a causal decoder still infers some order from the mask)."""
from __future__ import annotations

from .base import PositionalScheme
from .registry import register


@register("none")
class NoPositions(PositionalScheme):
    """Every hook is the base class's no-op."""
