"""The one causal / sliding-window mask every backend uses, its window check, the one test
for "positions are consecutive runs" that the fused backends and SDPA's built-in causal path need,
and the padding rule of padded batches.

Padded batches: `row_starts` (B,) int64 holds, per batch row, the position where its real tokens
begin (left padding: positions before it are padding; right padding needs nothing, since under the
causal mask no real query sees a later key). Positions stay shared by the batch (q_pos, k_pos are
(L,)); a row's padding keys (k_pos < row_starts[b]) are hidden from every query except the padding
slot itself, so a padding query attends to itself alone (finite, never read) and no real query
sees padding. A scheme that depends on absolute positions (embeddings, FIRE, log-n scaling) takes
the row's own positions, `row_positions`: position - row start.

Rows at their own positions (training's drawn positions, megatron/data/position_recipes.py):
q_pos and k_pos are then (B, L), one sorted row each, and every rule here reads each row's own;
the masks come out (B, 1, Lq, Lk).

Packed documents (`doc_starts`, training only: megatron/data/position_recipes.py): (B, L) int64 holds,
for token t of row b, the index of its document's first token. Query t sees key index j only when
doc_starts[b, t] <= j (the causal rule does the rest): a document is a contiguous run of a row, so
that one comparison is "same document". Queries and keys are the same L tokens (no kv-cache)."""
from __future__ import annotations

import torch

if __package__ == "megatron.attention":
    from megatron.positional.distance import run_start
else:  # the Hugging Face export ships this file flat, next to the positional package's distance.py
    from .distance import run_start


def check_window(window: int | None) -> None:
    """Raise the shared message unless window is None or an integer >= 1."""
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"attention window must be an integer >= 1 (the number of keys each query "
                         f"sees, itself included) or None for full causal attention; got {window!r}")


def allowed_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None = None,
                 row_starts: torch.Tensor | None = None, doc_starts: torch.Tensor | None = None,
                 first_key: int = 0) -> torch.Tensor:
    """Bool (Lq, Lk): True where query i may attend to key j; with `row_starts` (B,) (module
    docstring) bool (B, 1, Lq, Lk), the padding keys of each row hidden as well; with `doc_starts`
    (B, Lq) (module docstring: the queries' document starts, the keys the tokens at indices
    first_key .. first_key + Lk - 1) bool (B, 1, Lq, Lk), keys of other documents hidden too.

    Causal: k_pos[j] <= q_pos[i]. With a window W >= 1 also q_pos[i] - k_pos[j] < W, i.e. query i
    sees keys i-W < j <= i: exactly W keys including itself (window=1 keeps only the diagonal).
    NeoX's sliding_window_width W keeps j in [i-W, i], i.e. W+1 keys: pass W+1 here to match it.
    Positions are absolute, so kv-cache rows (q_pos = the last positions) need no special case.
    """
    check_window(window)
    diff = q_pos[..., :, None] - k_pos[..., None, :]  # (Lq, Lk) int64; (B, Lq, Lk) for rows' own positions
    allowed = diff >= 0
    if window is not None:
        allowed = allowed & (diff < window)
    if doc_starts is not None:
        allowed = allowed & same_document(doc_starts, first_key, k_pos.shape[-1])  # (B, Lq, Lk)
    if row_starts is not None:
        real_key = torch.atleast_2d(k_pos) >= row_starts.to(k_pos.device)[:, None]  # (B, Lk)
        allowed = allowed & (real_key[:, None, :] | (diff == 0))  # (B, Lq, Lk)
    return allowed[:, None] if allowed.dim() == 3 else allowed  # (B, 1, Lq, Lk) per row


def same_document(doc_starts: torch.Tensor, first_key: int = 0, num_keys: int | None = None) -> torch.Tensor:
    """Bool (B, Lq, Lk): key index j (first_key .. first_key + Lk - 1; Lk = num_keys, default Lq) is at
    or after the first index of query t's document, doc_starts[b, t]; with the causal rule (j <= t)
    that is "the same document" (module docstring)."""
    num_keys = doc_starts.shape[1] if num_keys is None else num_keys
    keys = torch.arange(first_key, first_key + num_keys, device=doc_starts.device)
    return keys[None, None, :] >= doc_starts[:, :, None]


def check_doc_starts(doc_starts: torch.Tensor | None, batch: int, length: int) -> None:
    """Raise unless doc_starts is None or a (batch, length) integer tensor (each token's document's
    first index); its values are the data module's to get right (position_recipes.document_starts)."""
    if doc_starts is None:
        return
    if (tuple(doc_starts.shape) != (batch, length) or doc_starts.is_floating_point()
            or doc_starts.dtype == torch.bool):
        raise ValueError(f"doc_starts must be a ({batch}, {length}) integer tensor (the index where each "
                         f"token's document begins), got {tuple(doc_starts.shape)} {doc_starts.dtype}")


def check_positions(positions: torch.Tensor, batch: int, length: int) -> None:
    """Raise unless positions are the tokens' own: a (length,) integer tensor shared by the rows, or
    (batch, length), each row its own (training's drawn positions)."""
    shape = tuple(positions.shape)
    if shape not in ((length,), (batch, length)) or positions.is_floating_point() or positions.dtype == torch.bool:
        raise ValueError(f"positions must be a ({length},) or ({batch}, {length}) integer tensor (the tokens' "
                         f"positions, shared by the rows or each row its own), got {shape} {positions.dtype}")


def query_blocks(q_pos: torch.Tensor, k_pos: torch.Tensor, span: int | None):
    """[(query slice, key index or slice)]: the queries cut into runs of `span` rows, each with
    the keys it may see causally (k_pos <= its last query), for a scheme whose rotation holds
    only `span` positions per call (PositionalScheme.max_query_span). One block, all keys, when
    the call fits (or span is None): the unblocked call, bit for bit."""
    L = q_pos.shape[-1]
    if span is None or L <= span or q_pos.numel() == 0:
        return [(slice(None), slice(None))]
    q0, k0 = run_start(q_pos), run_start(k_pos)
    blocks = []
    for s in range(0, L, span):
        rows = slice(s, min(s + span, L))
        if q0 is not None and k0 is not None:  # known runs: the keys up to the last query, a prefix
            keys = slice(0, max(min(k_pos.numel(), q0 + rows.stop - k0), 0))
        else:  # any row's keys up to the block's last query (rows' own positions: the mask does the rest)
            keys = torch.atleast_2d(k_pos <= q_pos[..., rows].max()).any(0).nonzero().squeeze(1)  # (Lk_block,)
        blocks.append((rows, keys))
    return blocks


def check_row_starts(row_starts: torch.Tensor | None, batch: int, values: bool = True) -> None:
    """Raise unless row_starts is None or a (batch,) integer tensor of starts >= 0. values=False
    checks only the shape and dtype (no device sync: the fused kernel's per-call check; the model
    checks the values once per forward)."""
    if row_starts is None:
        return
    if (row_starts.dim() != 1 or row_starts.shape[0] != batch or row_starts.is_floating_point()
            or row_starts.dtype == torch.bool):
        raise ValueError(f"row_starts must be a ({batch},) integer tensor (each row's first real position), "
                         f"got {tuple(row_starts.shape)} {row_starts.dtype}")
    if values and bool((row_starts < 0).any()):
        raise ValueError("row_starts must be >= 0 (the position where each row's real tokens begin)")


def row_positions(positions: torch.Tensor, row_starts: torch.Tensor | None) -> torch.Tensor:
    """Each row's own positions: the positions ((L,), or (B, L) per row) when row_starts is None,
    else (B, L) = position - row start, clamped at 0 (a padding slot takes position 0; its output is
    never read)."""
    if row_starts is None:
        return positions
    return (torch.atleast_2d(positions) - row_starts.to(positions.device)[:, None]).clamp_min(0)


def padding_mask(row_starts: torch.Tensor | None, length: int) -> torch.Tensor | None:
    """Bool (B, length) True at real tokens, for tokens at positions 0..length-1; None without padding."""
    if row_starts is None:
        return None
    return torch.arange(length, device=row_starts.device)[None, :] >= row_starts[:, None]


def row_starts_from_attention_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B,) row starts from a Hugging Face style (B, L) 0/1 attention mask whose ones are one
    contiguous run per row (left and/or right padding); None when nothing is padded on the left.
    Right padding needs no start (module docstring). Anything else (holes) is a ValueError."""
    if attention_mask is None:
        return None
    m = attention_mask.to(torch.bool)
    if m.dim() != 2:
        raise ValueError(f"attention_mask must be (batch, length), got shape {tuple(m.shape)}")
    length = m.shape[1]
    idx = torch.arange(length, device=m.device)
    has = m.any(dim=1)
    first = torch.where(m, idx, length).amin(dim=1)
    last = torch.where(m, idx, -1).amax(dim=1)
    contiguous = (m.sum(dim=1) == (last - first + 1)) | ~has
    if not bool(contiguous.all()):
        raise ValueError("attention_mask must mark one contiguous run of tokens per row (left or right "
                         "padding); masks with holes are not supported")
    first = torch.where(has, first, 0)
    return first if bool((first > 0).any()) else None


def consecutive_starts(q_pos: torch.Tensor, k_pos: torch.Tensor) -> tuple[int, int] | None:
    """(q0, k0) when q_pos = q0 + arange(Lq) and k_pos = k0 + arange(Lk), else None (also when
    either is empty). Known runs (position_run) answer on the host; anything else costs one
    host sync. Rows at their own positions ((B, L)) are never one shared run: None."""
    if q_pos.numel() == 0 or k_pos.numel() == 0 or q_pos.dim() != 1 or k_pos.dim() != 1:
        return None
    q0, k0 = run_start(q_pos), run_start(k_pos)
    if q0 is not None and k0 is not None:
        return q0, k0

    def steps_ok(pos):
        return (pos[1:] - pos[:-1] == 1).all()

    q0, k0, q_ok, k_ok = torch.stack([q_pos[0], k_pos[0], steps_ok(q_pos), steps_ok(k_pos)]).tolist()
    return (q0, k0) if q_ok and k_ok else None
