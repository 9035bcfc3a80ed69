"""Positions as data: the position ids and document spans a training micro-batch carries, drawn by
the recipes that change what positions a model sees (DESIGN.md contract 18). Evaluation and
generation never call this: they see consecutive positions from 0.

  - packed documents (Megatron-LM's `reset-attention-mask`, `reset-position-ids`): a document
    ends with its end-of-document token, which stays in the document it ends, and the next one
    starts after it (Megatron-LM's get_ltor_masks_and_position_ids: positions restart at i + 1 for
    an EOD at i, and no token after it attends to a token up to it);
  - randomized positions (Ruoss et al., ACL 2023, `pos-random-max-length` N): the sequence's L
    positions are a sorted draw without replacement from [0, N);
  - PoSE (Zhu et al., ICLR 2024, `pos-skip-target-length` T, `pos-skip-chunks` c): the L
    positions are cut into c chunks at uniformly drawn points; chunk 0 starts at 0 and each later
    chunk i is shifted by a skip u_i, the skips sorted uniform draws from [0, T - L] (the paper's
    u_i >= u_{i-1}), so the last position is at most T - 1 and the largest distance reaches T - 1
    when the last skip is T - L.

Each training sequence (row) has its own draw, as both papers train: the micro-batch's positions
are (B, L), which every scheme and the backends that take drawn positions (reference, SDPA) read per
row. A draw is a pure function of (seed, iteration, micro-step, data-parallel rank) and the row:
one generator per micro-batch draws its rows in order, so row b is the same whatever the
micro-batch size, and a resumed run draws exactly what the uninterrupted run drew, with no sampler
state to save."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from megatron.attention.documents import PackedDocuments
from megatron.positional.distance import sampled_positions


def document_starts(tokens: torch.Tensor, eod: int) -> torch.Tensor:
    """(B, L) int64: for each token, the index of its document's first token. A document ends
    with its EOD token (Megatron-LM: the token after an EOD starts the next document)."""
    index = torch.arange(tokens.shape[1], device=tokens.device)
    after_eod = torch.where(tokens == eod, index + 1, 0)  # where a document would start after t
    latest = after_eod.cummax(dim=1).values  # the last such start at or before t
    return torch.cat([torch.zeros_like(latest[:, :1]), latest[:, :-1]], dim=1)  # strictly before t


def random_positions(length: int, max_length: int, generator: torch.Generator) -> torch.Tensor:
    """(length,) int64: sorted positions drawn without replacement from [0, max_length)."""
    if max_length < length:
        raise ValueError(f"pos-random-max-length ({max_length}) must be at least the sequence length ({length})")
    return torch.randperm(max_length, generator=generator)[:length].sort().values


def pose_positions(length: int, target_length: int, chunks: int, generator: torch.Generator) -> torch.Tensor:
    """(length,) int64: PoSE's positions (module docstring): `chunks` chunks at uniform cut points,
    chunk 0 from 0, chunk i shifted by the i-th of sorted uniform skips in [0, target_length - length]."""
    if target_length < length or not 1 <= chunks <= length:
        raise ValueError(f"PoSE needs pos-skip-target-length ({target_length}) >= the sequence length ({length}) "
                         f"and 1 <= pos-skip-chunks ({chunks}) <= the sequence length")
    cuts = (torch.randperm(length - 1, generator=generator)[:chunks - 1] + 1).sort().values  # chunk starts
    skips = torch.randint(0, target_length - length + 1, (chunks - 1,), generator=generator).sort().values
    shift = torch.zeros(length, dtype=torch.int64)
    for cut, skip in zip(cuts.tolist(), skips.tolist()):
        shift[cut:] = skip  # skips never decrease, so later chunks overwrite with larger ones
    return torch.arange(length) + shift


def draw_generator(seed: int, iteration: int, micro_step: int, dp_rank: int) -> torch.Generator:
    """A generator seeded by the draw's coordinates alone (module docstring: exact resume)."""
    state = np.random.SeedSequence([seed, iteration, micro_step, dp_rank]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


@dataclass(frozen=True)
class PositionRecipe:
    """What a training micro-batch's positions are: the config's recipe keys, read once."""

    eod: int | None = None  # the tokenizer's end-of-document id (documents need it)
    reset_attention_mask: bool = False
    reset_position_ids: bool = False
    random_max_length: int | None = None
    skip_target_length: int | None = None
    skip_chunks: int = 2
    seed: int = 0

    @classmethod
    def from_config(cls, cfg, eod: int | None) -> PositionRecipe:
        d = cfg.data
        return cls(eod, d.reset_attention_mask, d.reset_position_ids, d.pos_random_max_length,
                   d.pos_skip_target_length, d.pos_skip_chunks, cfg.training.seed)

    @property
    def active(self) -> bool:
        return (self.reset_attention_mask or self.reset_position_ids or self.random_max_length is not None
                or self.skip_target_length is not None)

    def batch_inputs(self, tokens: torch.Tensor, iteration: int, micro_step: int, dp_rank: int) -> dict:
        """The model's extra inputs for one training micro-batch: {"documents": PackedDocuments}
        and/or {"positions": (B, L) int64 sampled positions, one draw per row}; {} when no recipe is on."""
        out = {}
        if self.reset_attention_mask or self.reset_position_ids:
            if self.eod is None:
                raise ValueError("reset-position-ids / reset-attention-mask need the tokenizer's end-of-document id")
            out["documents"] = PackedDocuments(document_starts(tokens, self.eod), self.reset_position_ids)
        rows, length = tokens.shape
        if self.random_max_length is not None or self.skip_target_length is not None:
            generator = draw_generator(self.seed, iteration, micro_step, dp_rank)
            out["positions"] = torch.stack([self.draw(length, generator) for _ in range(rows)])
        return out

    def draw(self, length: int, generator: torch.Generator) -> torch.Tensor:
        """(length,) positions of one sequence by the recipe's law (module docstring)."""
        if self.random_max_length is not None:
            return random_positions(length, self.random_max_length, generator)
        return pose_positions(length, self.skip_target_length, self.skip_chunks, generator)


def to_device(inputs: dict, device) -> dict:
    """batch_inputs' tensors on `device`, drawn positions keeping their mark (distance.sampled_positions)."""
    out = dict(inputs)
    if "documents" in out:
        out["documents"] = out["documents"].to(device)
    if "positions" in out:
        out["positions"] = sampled_positions(out["positions"].to(device))
    return out
