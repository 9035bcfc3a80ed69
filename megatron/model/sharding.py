"""What GPTModel's forward does with tensors this process holds whole (one rank).

The model is always built whole; megatron/parallel/plan.py shards a built model over
tensor-parallel ranks and puts its counterpart (megatron/parallel/layers.py: TensorParallelOps,
the same methods) in `model.sharding`, so no model code asks how it is split."""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn


class Unsharded:
    is_tensor_parallel = False

    def logits(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """x (B, L, h) -> logits (B, L, V)."""
        return F.linear(x, weight)

    def gather_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits  # already every vocabulary entry

    def token_cross_entropy(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """logits (N, V) float32, labels (N,) -> per-token loss (N,)."""
        return F.cross_entropy(logits, labels, reduction="none")

    def dropout_rng(self, device) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # attention dropout draws from the default stream

    def checkpoint_kwargs(self) -> dict:
        return {}

    def full_scheme(self, scheme: nn.Module) -> nn.Module:
        return scheme  # every head is here


UNSHARDED = Unsharded()
