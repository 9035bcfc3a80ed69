"""NeoX's language-model loss, one definition for GPTModel and the pipeline model."""
from __future__ import annotations

import torch


def masked_mean(losses: torch.Tensor, loss_mask: torch.Tensor | None = None) -> torch.Tensor:
    """sum(losses * loss_mask) / sum(loss_mask), the mask cast to the losses' dtype and shape
    (per-token float32 CE from the float logits); the plain mean without a mask."""
    if loss_mask is None:
        return losses.mean()
    mask = loss_mask.to(losses.dtype).reshape(losses.shape)
    return (losses * mask).sum() / mask.sum().clamp_min(1.0)
