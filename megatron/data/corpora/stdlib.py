"""Python source code from this interpreter's own standard library: a real code corpus
(~12 MB, PSF licence) that needs no download. One .py file = one document."""
from __future__ import annotations

import hashlib
import os
import random
import sysconfig

# Path components we skip: test suites (mostly generated/odd files, 17 MB), IDLE, and
# anything installed into the interpreter rather than shipped with it.
EXCLUDED_DIRS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__"}


ORDER_SEED = 1234  # document order; recorded by prepare.py so a change rebuilds the corpus


def stdlib_root() -> str:
    return sysconfig.get_paths()["stdlib"]


def list_source_files(root: str) -> list[str]:
    """Sorted relative paths of the .py files under root, minus excluded dirs and symlinked repeats."""
    seen_real, files = set(), []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED_DIRS)
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            path = os.path.join(dirpath, name)
            real = os.path.realpath(path)
            if real not in seen_real:
                seen_real.add(real)
                files.append(os.path.relpath(path, root))
    return sorted(files)


def iter_documents(max_files: int | None = None, max_mb: float | None = None, root: str | None = None, stats: dict | None = None):
    """Yield (source_text, {"path": relpath}) in a fixed pseudo-random order of the sorted paths.

    Why shuffled: NeoX splits train/valid/test by contiguous document ranges, so in path order
    the test split would be only the last packages alphabetically (xml, zipfile, ...), a
    different distribution from training. A seeded shuffle keeps the corpus deterministic.

    Files with identical contents are kept once; non-UTF-8 files are skipped. Stops after
    max_files documents or once max_mb megabytes (10**6 bytes) of source have been yielded.
    `stats` (if given) is filled with counts of what was kept and skipped.
    """
    root = root or stdlib_root()
    stats = {} if stats is None else stats
    stats.update(files=0, bytes=0, duplicates=0, not_utf8=0, root=root)
    seen_hashes = set()
    paths = list_source_files(root)
    random.Random(ORDER_SEED).shuffle(paths)
    for rel in paths:
        if (max_files is not None and stats["files"] >= max_files) or (max_mb is not None and stats["bytes"] >= max_mb * 1e6):
            break
        with open(os.path.join(root, rel), "rb") as f:
            raw = f.read()
        digest = hashlib.sha256(raw).digest()
        if digest in seen_hashes:
            stats["duplicates"] += 1
            continue
        seen_hashes.add(digest)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            stats["not_utf8"] += 1
            continue
        if not text.strip():
            continue  # empty __init__.py files carry no text (and preprocessing drops empty docs)
        stats["files"] += 1
        stats["bytes"] += len(raw)
        yield text, {"path": rel}
