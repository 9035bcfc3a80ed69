"""LaTeX / TeX sources (stand-in for the Pile's ArXiv):
- pari: Debian pari-doc 2.15.2-1, the PARI/GP manuals' plain-TeX sources (/usr/share/pari/doc/*.tex,
  ~3 MB, GPL-2+), split at `\\section` lines so ~18 huge files become ~200 documents;
- texlive (optional, 213 MB download): Debian texlive-publishers-doc 2022.20230122-4, journal and
  conference templates and sample articles (*.tex.gz under /usr/share/doc/texlive-doc/, ~11 MB).
"""
from __future__ import annotations

import gzip
import os
import re

from megatron.data.corpora.clean import decode_text, read_text, split_at
from megatron.data.corpora.sources import Source

PARI_DOC = "usr/share/pari/doc/"
SECTION = re.compile(r"^\\section\b", re.MULTILINE)
TEXLIVE_DOC = "usr/share/doc/texlive-doc/"


def pari_candidates(root: str):
    doc = os.path.join(root, PARI_DOC)
    out = []
    for name in sorted(os.listdir(doc)):
        if name.endswith(".tex"):
            text = read_text(os.path.join(doc, name)) or ""
            for i, part in enumerate(split_at(text, SECTION)):
                out.append(({"path": name, "part": i}, lambda p=part: p))
    return out


def _gunzip_text(path: str) -> str | None:
    with open(path, "rb") as f:
        return decode_text(gzip.decompress(f.read()))


def texlive_candidates(root: str):
    doc = os.path.join(root, TEXLIVE_DOC)
    out = []
    for dirpath, dirnames, filenames in os.walk(doc):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, doc)
            if name.endswith(".tex.gz"):
                out.append(({"path": rel}, lambda p=path: _gunzip_text(p)))
            elif name.endswith(".tex"):
                out.append(({"path": rel}, lambda p=path: read_text(p)))
    return sorted(out, key=lambda c: c[0]["path"])


PARI = Source("pari", "apt", "pari-doc", "2.15.2-1", lambda n: n.startswith(PARI_DOC) and n.endswith(".tex"),
              pari_candidates, sha256="6806e4ab123811d7234dd3330941a0ab777562708109ccbce7fc8907226deddc")
TEXLIVE = Source("texlive", "apt", "texlive-publishers-doc", "2022.20230122-4",
                 lambda n: n.startswith(TEXLIVE_DOC) and n.endswith((".tex.gz", ".tex")), texlive_candidates)
