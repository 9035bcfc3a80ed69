"""Do an index's document boundaries fall on the .bin's end-of-document tokens? The check a
dataset without an identity sidecar (identity.py) can still have.

An .idx built from the same documents in another order lists the same sizes, so its pointers add
up and it fits a .bin of the same size exactly (indexed._index_problem passes), while every
document it reads is cut from pieces of others. Where the data ends its documents with an
end-of-document token (preprocess_data.py --append-eod, NeoX's usual command), a right index ends
(nearly) every document on it and a wrong one almost none. The token is taken from the data: the
.bin's last token ends its last document whatever the index says.

"Where the data has them": a .bin without such tokens must not be refused because its documents
end anywhere. It counts as having them when its first end-of-document tokens cut it into pieces
of the sizes the index lists (each size as often as the index has it) and occur about once per
document on average. Cheap for any size: a few thousand sampled document ends; only when those
disagree, a prefix of the .bin (at most PREFIX_TOKENS) and the index's sizes are read.
"""
from __future__ import annotations

import numpy as np

SAMPLED_ENDS = 4096  # document ends looked at (evenly spaced) on every open
AGREE = 0.5  # share of sampled ends on the token above which the boundaries are taken as right
PREFIX_TOKENS = 1 << 22  # at most this much of the .bin is scanned when they are not
PREFIX_DOCS = 256  # end-of-document tokens whose spacing is compared with the index's sizes
MIN_DOCS = 8  # fewer found: too little to tell, accepted


def boundary_problem(tokens: np.ndarray, sizes: np.ndarray, pointers: np.ndarray, doc_idx: np.ndarray) -> str | None:
    """What is wrong with the document boundaries of an index (sizes in tokens, pointers in bytes,
    doc_idx) over `tokens` (the .bin as its dtype), or None."""
    if len(tokens) < 2 or len(sizes) == 0:
        return None
    doc_sizes = _document_sizes(sizes, doc_idx)
    last_items = (doc_idx[1:] - 1 if len(doc_idx) >= 2 else np.arange(len(sizes)))[doc_sizes > 0]
    if len(last_items) > SAMPLED_ENDS:
        last_items = last_items[np.linspace(0, len(last_items) - 1, SAMPLED_ENDS).astype(np.int64)]
    ends = pointers[last_items] // tokens.itemsize + sizes[last_items].astype(np.int64) - 1
    eod = tokens[-1]
    share = float(np.mean(tokens[ends] == eod))
    if share > AGREE:
        return None
    if not _ends_documents(tokens, eod, doc_sizes[doc_sizes > 0], int(np.sum(doc_sizes, dtype=np.int64))):
        return None  # the data has no end-of-document token to hold the index to
    return (f"its document boundaries do not fall on the .bin's end-of-document token {int(eod)}: only {share:.0%} "
            f"of {len(ends)} sampled documents end on it, while the .bin holds one per document, at the places the "
            "index's document sizes put them in another order (an .idx of another build, e.g. the same documents "
            "in another order)")


def _document_sizes(sizes: np.ndarray, doc_idx: np.ndarray) -> np.ndarray:
    """Tokens per document (a document is doc_idx[i] .. doc_idx[i+1]-1; items, when doc_idx is empty)."""
    if len(doc_idx) < 2:
        return np.asarray(sizes, dtype=np.int64)
    starts = np.asarray(doc_idx[:-1], dtype=np.int64)
    cum = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
    return cum[np.asarray(doc_idx[1:], dtype=np.int64)] - cum[starts]


def _ends_documents(tokens: np.ndarray, eod, doc_sizes: np.ndarray, total: int) -> bool:
    """Whether `eod` ends the .bin's documents (module docstring): the spacing of its first
    occurrences is a sub-multiset of the documents' sizes, at about one per document."""
    prefix = np.asarray(tokens[:PREFIX_TOKENS])
    found = np.flatnonzero(prefix == eod)
    if len(found) < MIN_DOCS:
        return False
    expected = len(prefix) * len(doc_sizes) / max(total, 1)  # occurrences if once per document
    if not 0.5 * expected <= len(found) <= 2 * expected:
        return False
    gaps = np.diff(found[:PREFIX_DOCS], prepend=-1)
    values, counts = np.unique(gaps, return_counts=True)
    listed, listed_counts = np.unique(doc_sizes, return_counts=True)
    at = np.searchsorted(listed, values)
    present = (at < len(listed)) & (listed[np.minimum(at, len(listed) - 1)] == values)
    return bool(present.all() and (listed_counts[at] >= counts).all())
