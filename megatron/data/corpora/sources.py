"""A downloadable document source (package, version, checksum, files to keep, how to read them)
and the generic fetch/documents built from one or several sources (e.g. web = wiki + austen).

Documents are produced lazily from a shuffled list of candidates (metadata + a loader), so a
`max_files`/`max_mb` slice reads only the files it keeps. See clean.py for why the order is a
fixed seeded shuffle and what is cleaned.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from megatron.data.corpora.clean import iter_clean, shuffled
from megatron.fetch import fetch_and_extract

Candidate = tuple[dict, Callable[[], "str | None"]]  # (meta, load() -> text, or None to skip)


@dataclass(frozen=True)
class Source:
    name: str
    kind: str  # "pip", "apt", or "local" (already on disk: root from local_root())
    package: str | None
    version: str | None
    keep: Callable[[str], bool] | None  # archive member paths to extract
    candidates: Callable[[str], list[Candidate]]  # root -> candidates, in a deterministic (sorted) order
    sha256: str | None = None
    local_root: Callable[[], str] | None = None

    def root(self, data_dir: str) -> str:
        if self.kind == "local":
            return self.local_root()
        return os.path.join(data_dir, "downloads", self.package)

    def fetch(self, data_dir: str, log=print) -> str:
        if self.kind == "local":
            return self.local_root()
        return fetch_and_extract(self.kind, self.package, self.version, data_dir, self.keep, self.sha256, log)


def make_fetch(sources: list[Source]):
    def fetch(data_dir: str = "data", log=print) -> dict[str, str]:
        return {s.name: s.fetch(data_dir, log) for s in sources}
    return fetch


def _load(candidates):
    for meta, load in candidates:
        text = load()
        if text is not None:
            yield text, meta


def make_documents(sources: list[Source]):
    """documents(max_files, max_mb, stats, data_dir="data", roots=None): cleaned, deduplicated documents
    of all sources in one seeded shuffled order. `roots` ({source name: dir}) overrides where each
    source's extracted files are (tests point it at a small fake package tree)."""
    def documents(max_files=None, max_mb=None, stats=None, data_dir: str = "data", roots: dict | None = None):
        roots = roots or {}
        candidates = []
        for s in sources:
            root = roots.get(s.name) or s.root(data_dir)
            if not os.path.isdir(root):
                raise ValueError(f"{s.name}: {root} does not exist; fetch it first (tools/prepare_data.py downloads "
                                 f"{s.package} {s.version} into {data_dir}/downloads/)")
            candidates += [({"source": s.name, **meta}, load) for meta, load in s.candidates(root)]
        yield from iter_clean(_load(shuffled(candidates)), max_files, max_mb, stats)
    return documents
