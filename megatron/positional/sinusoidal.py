"""Fixed sinusoidal absolute positions (Vaswani et al.) in NeoX's layout: cat(sin, cos), not
interleaved, added to the token embeddings."""
from __future__ import annotations

import torch

from .base import PositionalScheme, PositionalSpec
from .registry import register


def sinusoidal_inv_freq(dim: int, base: float = 10000.0) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))  # (dim/2,)


@register("sinusoidal")
class SinusoidalPositions(PositionalScheme):
    def __init__(self, spec: PositionalSpec):
        super().__init__(spec)
        # Persistent: NeoX checkpoints carry `position_embeddings.inv_freq`.
        self.register_buffer("inv_freq", sinusoidal_inv_freq(spec.hidden_size), persistent=True)

    def embed(self, positions: torch.Tensor) -> torch.Tensor:
        # A bf16-cast model would round inv_freq; the angles must stay fp32 at long positions.
        inv_freq = self.inv_freq
        if inv_freq.dtype != torch.float32:
            inv_freq = sinusoidal_inv_freq(self.spec.hidden_size).to(positions.device)
        angles = positions.to(torch.float32)[..., None] * inv_freq  # (..., L, hidden/2)
        return torch.cat([angles.sin(), angles.cos()], dim=-1)  # (..., L, hidden): (B, L, hidden) for padded rows
