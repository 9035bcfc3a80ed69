"""Key/value cache for incremental decoding (generate.py, the HF export's reference).

The cache stores, per layer, the keys (already rotated, for rotary; raw for a scheme whose
rotation depends on the whole call, xPos's `rotate_after_cache`) and values of every past
token, plus their absolute positions. A forward with a cache feeds only the NEW tokens:

    q_pos = past_len + arange(new)            # the new query rows
    k_pos = cat(kept past positions, q_pos)   # every key a new query may see

Positional schemes take absolute q_pos/k_pos, so no scheme needs a special case (the paper's
code could only decode one token at a time, reading row sk-1 of its bias matrix).

With a sliding window W, keys that no future query can see (k_pos <= next_query - W) are
dropped after each step, so memory stays O(W) instead of growing with the generated text.
Single-rank models only: the tensor-parallel and pipeline paths do not take a cache.
"""
from __future__ import annotations

import torch

from megatron.positional.distance import position_run, run_start


class SharedPrefix:
    """A fork's layer entry (KVCache.repeat_rows): the past keys and values (B, H_kv, L_past, D) of the
    B rows forked, each read by its n rows, and each row's own keys and values since the fork
    (B * n, H_kv, L_own, D) or None. Kept apart, so the n rows read one copy of the past
    (megatron/model/shared_prefix.py); `materialize()` gives the plain (B * n, ...) tensors where
    a caller needs them."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, n: int):
        self.k, self.v, self.n = k, v, n
        self.own: tuple[torch.Tensor, torch.Tensor] | None = None

    def materialize(self) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = _repeat_rows(self.k, self.n), _repeat_rows(self.v, self.n)
        if self.own is not None:
            k, v = torch.cat([k, self.own[0]], dim=2), torch.cat([v, self.own[1]], dim=2)
        return k, v


def _repeat_rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """(B, ...) -> (B * n, ...), row b * n + j = row b. For one row a view (stride 0, no copy): the
    next append copies it once anyway (LayerCache.update's cat), so a copy here would be a second."""
    return t[:, None].expand(t.shape[0], n, *t.shape[1:]).reshape(t.shape[0] * n, *t.shape[1:])


def _plain(entry) -> tuple[torch.Tensor, torch.Tensor]:
    return entry.materialize() if isinstance(entry, SharedPrefix) else entry


def _plain_or_none(entry):
    return None if entry is None else _plain(entry)


class LayerCache:
    """One layer's slot: `update(k_new, v_new)` appends and returns every kept key/value."""

    def __init__(self, owner: KVCache, index: int):
        self.owner, self.index = owner, index

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # k, v: (B, H, L_new, D) -> (B, H, L_kept + L_new, D)
        past = self.owner.kv[self.index]
        if isinstance(past, SharedPrefix):  # a fork read the plain way: every row its own copy from here
            past = past.materialize()
        if past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        self.owner.kv[self.index] = (k, v)
        return k, v

    def shared_prefix(self) -> SharedPrefix | None:
        """This layer's entry when it is a fork's shared past with no own keys yet (the first forward
        on the fork: megatron/model/shared_prefix.py reads the past once for all rows), else None."""
        entry = self.owner.kv[self.index]
        return entry if isinstance(entry, SharedPrefix) and entry.own is None else None

    def append_own(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Record the rows' own new keys and values beside the shared past (after shared_prefix())."""
        self.owner.kv[self.index].own = (k, v)


class KVCache:
    def __init__(self, num_layers: int, window: int | None = None):
        self.kv: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * num_layers
        self.window = window
        self.length = 0  # tokens seen so far (the next query's position)
        self.positions: torch.Tensor | None = None  # (L_kept,) absolute positions of kept keys
        # (B,) first real position of each left-padded row (megatron/attention/mask.py), or None:
        # set by the first call, kept for every later one (the padding stays in the cache).
        self.row_starts: torch.Tensor | None = None

    def layer(self, index: int) -> LayerCache:
        return LayerCache(self, index)

    def repeat_rows(self, n: int) -> KVCache:
        """A fork whose row b * n + j is this cache's row b (j < n): n continuations of each row read
        on one shared prefix (retrieval's candidates, megatron/evaluation/retrieval/scoring.py). This
        cache is not changed: appending makes new tensors (LayerCache.update)."""
        fork = KVCache(len(self.kv), self.window)
        fork.kv = [None if kv is None else SharedPrefix(*_plain(kv), n) for kv in self.kv]
        fork.length, fork.positions = self.length, self.positions
        fork.row_starts = None if self.row_starts is None else self.row_starts.repeat_interleave(n)
        return fork

    def keep_row_starts(self, row_starts: torch.Tensor | None) -> torch.Tensor | None:
        """The row starts for this call: given with the first call (and kept), else the kept ones."""
        if row_starts is not None:
            if self.length > 0 and (self.row_starts is None or not torch.equal(
                    self.row_starts, row_starts.to(self.row_starts.device))):
                raise ValueError("row_starts (left padding) are set by the first call on a kv-cache; "
                                 "later calls must pass the same or none")
            self.row_starts = row_starts
        return self.row_starts

    def step_positions(self, new: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(q_pos, k_pos) for a forward over `new` tokens on top of the cache. The kept keys are
        always one run ending at the next query (a suffix of 0 .. length - 1), so both are made
        as known runs (positional/distance.py position_run): no layout check reads the device while decoding."""
        q_pos = position_run(self.length, new, device)
        if self.positions is None:
            return q_pos, q_pos
        first = run_start(self.positions)
        if first is not None and first + self.positions.numel() == self.length:
            return q_pos, position_run(first, self.positions.numel() + new, device)
        return q_pos, torch.cat([self.positions.to(device), q_pos])

    def advance(self, k_pos: torch.Tensor) -> None:
        """Called once all layers appended the step's keys: record them, trim out-of-window keys."""
        first = run_start(k_pos)
        self.length = first + k_pos.numel() if first is not None else int(k_pos[-1]) + 1
        self.positions = k_pos
        if self.window is not None:
            self.keep_from(self.length - self.window + 1)  # the next query (pos = length) sees k > q - W

    def keep_from(self, position: int) -> None:
        """Drop the cached keys before `position` (the window above; blockwise causal evaluation)."""
        if self.positions is None:
            return
        start, kept = run_start(self.positions), self.positions.numel()
        if start is not None:  # a known run: the suffix from `position` on, counted on the host
            first = min(max(position - start, 0), kept)
        else:
            keep = self.positions >= position
            first = int(keep.nonzero()[0]) if bool(keep.any()) else kept  # increasing: keep a suffix
        if first == 0:
            return
        self.positions = (position_run(start + first, kept - first, self.positions.device) if start is not None
                          else self.positions[first:])
        self.kv = [None if kv is None else (kv[0][:, :, first:], kv[1][:, :, first:])
                   for kv in map(_plain_or_none, self.kv)]
