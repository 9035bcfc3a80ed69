"""The cleaning, deduplication, ordering and size limits every downloaded corpus shares.

Why each step:
- newlines normalised to \\n and NULs stripped: tokenizers and the .bin format should not see
  platform line endings or binary garbage; trailing spaces are kept (code indentation matters);
- very short documents dropped (< MIN_CHARS): stubs and boilerplate only add EOD tokens;
- exact duplicates dropped by content hash (sha256 of the cleaned text): repeated files would leak
  between NeoX's train/valid/test splits and inflate the score;
- a fixed seeded shuffle of the document order: NeoX splits by contiguous document ranges, so in
  file order the test split would be the alphabetically last packages (or the last novels), a
  different distribution from training; seeding keeps every build identical.
"""
from __future__ import annotations

import hashlib
import random

MIN_CHARS = 64
ORDER_SEED = 1234  # every corpus's document order; recorded as the corpus `order`


def clean_text(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    return text.strip("\n")


def shuffled(items: list, seed: int = ORDER_SEED) -> list:
    items = list(items)
    random.Random(seed).shuffle(items)
    return items


def iter_clean(candidates, max_files: int | None = None, max_mb: float | None = None, stats: dict | None = None,
               min_chars: int = MIN_CHARS, normalise: bool = True):
    """Clean, filter and dedup (text, meta) candidates, stopping at max_files documents or once max_mb
    megabytes (10**6 UTF-8 bytes) were yielded; fills `stats` (files, bytes, duplicates, too_short).
    normalise=False keeps each text byte for byte (the stdlib corpus, whose token stream, and so the
    quickstart figures, is defined on the raw source files)."""
    stats = {} if stats is None else stats
    stats.update(files=0, bytes=0, duplicates=0, too_short=0)
    seen = set()
    for text, meta in candidates:
        if (max_files is not None and stats["files"] >= max_files) or (max_mb is not None and stats["bytes"] >= max_mb * 1e6):
            break
        if normalise:
            text = clean_text(text)
        if len(text.strip()) < min_chars:
            stats["too_short"] += 1
            continue
        digest = hashlib.sha256(text.encode("utf-8")).digest()
        if digest in seen:
            stats["duplicates"] += 1
            continue
        seen.add(digest)
        stats["files"] += 1
        stats["bytes"] += len(text.encode("utf-8"))
        yield text, meta


def read_text(path: str) -> str | None:
    """UTF-8 text of a file (latin-1 fallback: old TeX sources), None for binary files (a NUL in the first KB)."""
    with open(path, "rb") as f:
        return decode_text(f.read())


def decode_text(raw: bytes) -> str | None:
    """See read_text."""
    if b"\x00" in raw[:1024]:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def split_at(text: str, pattern) -> list[str]:
    """Split before every line matching `pattern` (a compiled multiline regex); text before the first
    match stays with the first part. Why: books and manuals are few, huge files, and NeoX splits
    train/valid/test by whole documents, so chapters/sections make the splits usable."""
    starts = [m.start() for m in pattern.finditer(text)]
    if not starts:
        return [text]
    bounds = [0] + starts[1:] + [len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]
