"""Go standard library + toolchain source (BSD-3) from Debian's golang-1.19-src 1.19.8-2:
`/usr/share/go-1.19/src/**/*.go` minus tests (`_test.go`), `testdata/` and `vendor/` (third-party
copies and fixtures, not the library itself); ~42 MB, one file = one document."""
from __future__ import annotations

import os

from megatron.data.corpora.clean import read_text
from megatron.data.corpora.sources import Source

SRC = "usr/share/go-1.19/src/"
EXCLUDED_DIRS = {"testdata", "vendor"}


def wanted(path: str) -> bool:
    if not path.startswith(SRC) or not path.endswith(".go") or path.endswith("_test.go"):
        return False
    return not EXCLUDED_DIRS & set(path[len(SRC):].split("/")[:-1])


def candidates(root: str):
    src = os.path.join(root, SRC)
    out = []
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED_DIRS)
        for name in sorted(filenames):
            rel = os.path.relpath(os.path.join(dirpath, name), src)
            path = os.path.join(dirpath, name)
            if wanted(SRC + rel.replace(os.sep, "/")):
                out.append(({"path": rel}, lambda p=path: read_text(p)))
    return sorted(out, key=lambda c: c[0]["path"])


SOURCE = Source("golang", "apt", "golang-1.19-src", "1.19.8-2", wanted, candidates,
                sha256="2dfa82fe4f08f4e0193c532e561af4c91871f5235608f04f2bb8d57bb288df5a")
