"""Registry of corpora that tools/prepare_data.py can build offline.

A corpus is a function yielding (text, meta) documents that accepts max_files / max_mb
(to build small slices for tests) and a `stats` dict it fills in. To add one (wiki, austen,
golang, ...): write `megatron/data/corpora/<name>.py` with such a function and register it below.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from megatron.data.corpora import stdlib


@dataclass(frozen=True)
class Corpus:
    name: str
    documents: Callable[..., Iterator[tuple[str, dict]]]  # (max_files, max_mb, stats=) -> (text, meta)
    description: str
    order: str | None = None  # how documents are ordered (part of the build's cache key)


CORPORA: dict[str, Corpus] = {
    "stdlib": Corpus("stdlib", stdlib.iter_documents, "Python source of this interpreter's standard library (~11 MB)",
                     order=f"shuffled-{stdlib.ORDER_SEED}"),
}


def get_corpus(name: str) -> Corpus:
    if name not in CORPORA:
        raise ValueError(f"unknown corpus {name!r}; available: {', '.join(sorted(CORPORA))}")
    return CORPORA[name]
