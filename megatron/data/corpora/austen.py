"""Jane Austen's six novels (public domain, 4.0 MB) from Debian's r-cran-janeaustenr 1.0.0-1.

The package stores each novel as an R character vector (one element per printed line) inside
R's lazy-load database data/Rdata.rdb/.rdx, read here in pure Python (rdata.py), no R needed.
Each novel is split into chapters (one document each): six huge documents would make NeoX's
document-range train/valid/test split unusable, chapters (~300) make it representative.
"""
from __future__ import annotations

import os
import re

from megatron.data.corpora.clean import split_at
from megatron.data.corpora.rdata import read_lazyload_db
from megatron.data.corpora.sources import Source

DATA = "usr/lib/R/site-library/janeaustenr/data/Rdata"
CHAPTER = re.compile(r"^(?:CHAPTER|Chapter)\s+[0-9IVXLC]+\.?\s*$", re.MULTILINE)


def candidates(root: str):
    prefix = os.path.join(root, DATA)
    if not os.path.isfile(prefix + ".rdb"):
        raise ValueError(f"{prefix}.rdb is missing; fetch r-cran-janeaustenr again")
    out = []
    for book, obj in sorted(read_lazyload_db(prefix).items()):
        if not isinstance(obj.value, list) or not all(isinstance(x, str | None) for x in obj.value):
            continue  # not a character vector
        text = "\n".join(line or "" for line in obj.value)
        for i, chapter in enumerate(split_at(text, CHAPTER)):
            out.append(({"book": book, "chapter": i}, lambda c=chapter: c))
    return out


SOURCE = Source("austen", "apt", "r-cran-janeaustenr", "1.0.0-1", lambda name: name.startswith(DATA + "."), candidates,
                sha256="df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95")
