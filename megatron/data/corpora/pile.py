"""User-provided Pile-format files (`.jsonl.zst` with {"text", "meta"} lines, e.g. real Pile shards)
through the same archive -> tokenizer -> .bin/.idx path as the built-in corpora, with no fetch.

Documents are cleaned and deduplicated like every corpus but NOT shuffled: Pile shards are already
shuffled, and streaming keeps memory flat on multi-GB inputs (only 32-byte hashes are held)."""
from __future__ import annotations

import hashlib
import os

from megatron.data.corpora import Corpus
from megatron.data.corpora.clean import iter_clean
from megatron.data.documents import read_documents
from megatron.errors import DataError


def pile_corpus(inputs: list[str], name: str):
    """A Corpus named `name` over the given files (checked to exist)."""
    inputs = [p.strip() for p in inputs if p.strip()]
    if not inputs:
        raise DataError("pile: no input given; pass --input FILE.jsonl.zst[,FILE2...]")
    missing = [p for p in inputs if not os.path.exists(p)]
    if missing:
        raise DataError(f"pile: input {missing[0]!r} does not exist; pass existing .jsonl.zst files to --input")

    def documents(max_files=None, max_mb=None, stats=None, **_):
        def stream():  # read_documents: line-numbered errors, truncated .zst detected
            for doc in read_documents(inputs):
                yield doc.text, {**doc.meta, "input": os.path.basename(doc.path)}
        yield from iter_clean(stream(), max_files, max_mb, stats, min_chars=1)

    ident = hashlib.sha256("\n".join(f"{os.path.abspath(p)}:{os.path.getsize(p)}" for p in inputs).encode()).hexdigest()
    return Corpus(name, documents, f"Pile-format files: {', '.join(inputs)}", order=f"input-{ident[:16]}",
                  inputs=tuple(inputs))
