"""Learned absolute positions (GPT-2 / NeoX default): a [max_positions, hidden] table added to
the token embeddings. It cannot represent positions past the table, so it does not extrapolate."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .base import PositionalScheme, PositionalSpec
from .distance import run_start
from .registry import register


@register("learned")
class LearnedPositions(PositionalScheme):
    extrapolates = False

    def __init__(self, spec: PositionalSpec):
        super().__init__(spec)
        # Named `weight` so the checkpoint key is `<scheme attr>.weight`, like NeoX's nn.Embedding.
        self.weight = nn.Parameter(torch.empty(spec.max_position_embeddings, spec.hidden_size))
        nn.init.normal_(self.weight, mean=0.0, std=spec.init_method_std)

    def max_length(self) -> int | None:
        return self.spec.max_position_embeddings

    def embed(self, positions: torch.Tensor) -> torch.Tensor:
        # positions: (L,) or (B, L) (padded rows) int64 -> (..., L, hidden)
        n = self.spec.max_position_embeddings
        if not positions.numel():
            return F.embedding(positions, self.weight)
        start = run_start(positions)  # the model's own positions: bounds known on the host
        low, high = ((start, start + positions.numel() - 1) if start is not None
                     else torch.stack([positions.min(), positions.max()]).tolist())
        if high >= n or low < 0:
            raise ValueError(
                f"learned positions cannot extrapolate past max-position-embeddings={n} "
                f"(got positions up to {high}); evaluate at seq-length <= {n} "
                "or train with a relative scheme (rotary, alibi, kerple_*)")
        return F.embedding(positions, self.weight)
