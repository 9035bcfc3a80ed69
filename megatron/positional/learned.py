"""Learned absolute positions (GPT-2 / NeoX default): a [max_positions, hidden] table added to
the token embeddings. It cannot represent positions past the table, so it does not extrapolate."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .base import PositionalScheme, PositionalSpec
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
        if positions.numel() and (int(positions.max()) >= n or int(positions.min()) < 0):
            raise ValueError(
                f"learned positions cannot extrapolate past max-position-embeddings={n} "
                f"(got positions up to {int(positions.max())}); evaluate at seq-length <= {n} "
                "or train with a relative scheme (rotary, alibi, kerple_*)")
        return F.embedding(positions, self.weight)
