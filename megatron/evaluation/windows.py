"""Which windows of the split an evaluation scores (kept free of heavy imports: evaluate.py's
argument parser reads it before torch is loaded).

    shuffled    the first N windows in NeoX's seeded sample order: what the KERPLE paper scored
                (320 per length), a sample of the whole split, different windows at each length
    contiguous  the first N windows in stream order: every length covers the same leading tokens
"""
from __future__ import annotations

WINDOW_ORDERS = ("shuffled", "contiguous")
DESCRIPTIONS = {"shuffled": "NeoX's shuffled sample order", "contiguous": "stream order, the split's leading tokens"}


def windows_line(window_order: str | None, data_seed) -> str:
    """One sentence for a results table: the order and the data seed (results compare only when
    both match). Files written before the order was recorded used stream order."""
    order = window_order or "contiguous"
    return f"Windows: {order} ({DESCRIPTIONS.get(order, order)}), data seed {data_seed}."
