"""Packed documents: the one object a training batch hands the model and every attention backend
when a row holds several documents (reset-attention-mask / reset-position-ids, Megatron-LM's keys).

`starts` (B, L) int64: for token t of row b, the index of the first token of its document, which
is all the mask needs (megatron/attention/mask.py: key j is in query t's document iff
starts[b, t] <= j <= t). `reset_positions`: the positions restart at each document, so whatever
reads absolute positions (embeddings, FIRE, log-n scaling) takes `positions` (t - starts[b, t]);
a relative scheme needs nothing, since within a document i - j is the same from either origin
and other documents are masked. Built from the tokens by megatron/data/position_recipes.py."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch


@dataclass(frozen=True)
class PackedDocuments:
    starts: torch.Tensor  # (B, L) int64: the index where each token's document begins
    reset_positions: bool = False  # reset-position-ids: positions restart at each document
    # The starts still on the host when these were moved from it (to()): cu_seqlens reads them there
    host_starts: torch.Tensor | None = field(default=None, compare=False, repr=False)

    @cached_property  # derived once per batch, read by every layer
    def positions(self) -> torch.Tensor:
        """(B, L) int64: each token's position within its document."""
        index = torch.arange(self.starts.shape[1], device=self.starts.device)
        return index[None, :] - self.starts

    @cached_property
    def ends(self) -> torch.Tensor:
        """(B, L) int64: one past the last index of each token's document."""
        B, L = self.starts.shape
        index = torch.arange(L, device=self.starts.device)
        firsts = torch.where(self.starts == index[None, :], index[None, :], L)  # a document's first token
        after = firsts.flip(1).cummin(1).values.flip(1)  # (B, L): the first document start at or after t
        return torch.cat([after[:, 1:], torch.full((B, 1), L, device=self.starts.device, dtype=after.dtype)], dim=1)

    @cached_property
    def bounds(self) -> torch.Tensor:
        """(B, 2, L) int64: starts and ends, the per-token document bounds the Triton kernels read."""
        return torch.stack([self.starts, self.ends], dim=1)

    @cached_property
    def cu_seqlens(self) -> torch.Tensor:
        """(documents + 1,) int32: where each document of the flattened (B * L) batch begins, then B * L
        (flash-attn's varlen `cu_seqlens`). A row's first token always begins a document. Counted
        from the host's copy of the starts when there is one (a nonzero() on a GPU would wait for the
        device in every step), and only when a backend asks (flash)."""
        starts = self.starts if self.host_starts is None else self.host_starts
        B, L = starts.shape
        index = torch.arange(L, device=starts.device)
        firsts = (starts == index[None, :]).flatten().nonzero().squeeze(1)
        return torch.cat([firsts, firsts.new_tensor([B * L])]).to(device=self.starts.device, dtype=torch.int32)

    def to(self, device) -> PackedDocuments:
        host = self.starts if self.starts.device.type == "cpu" else self.host_starts
        return PackedDocuments(self.starts.to(device=device, dtype=torch.int64), self.reset_positions, host)

    def within_positions(self) -> torch.Tensor | None:
        """The per-row positions absolute-position parts read: within each document when positions
        restart, else None (the row's own positions stand)."""
        return self.positions if self.reset_positions else None
