"""Python source code from this interpreter's own standard library: a real code corpus
(~12 MB, PSF licence) that needs no download. One .py file = one document."""
from __future__ import annotations

import os
import sysconfig

from megatron.data.corpora.clean import iter_clean, shuffled

# Path components we skip: test suites (mostly generated/odd files, 17 MB), IDLE, and
# anything installed into the interpreter rather than shipped with it.
EXCLUDED_DIRS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__"}


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
    """Yield (source_text, {"path": relpath}) in the shared seeded order of the sorted paths
    (clean.shuffled: NeoX splits by contiguous document ranges, so path order would make the
    test split the last packages alphabetically).

    The shared cleaner (clean.iter_clean) dedups, drops empty files and stops after max_files
    documents or max_mb megabytes; the source is kept byte for byte (normalise=False). Non-UTF-8
    files are skipped. `stats` (if given) gets iter_clean's counts plus not_utf8 and root.
    """
    root = root or stdlib_root()
    stats = {} if stats is None else stats

    def candidates():  # runs after iter_clean reset stats, so these counts survive
        stats.update(not_utf8=0, root=root)
        for rel in shuffled(list_source_files(root)):
            with open(os.path.join(root, rel), "rb") as f:
                raw = f.read()
            try:
                yield raw.decode("utf-8"), {"path": rel}
            except UnicodeDecodeError:
                stats["not_utf8"] += 1

    yield from iter_clean(candidates(), max_files, max_mb, stats, min_chars=1, normalise=False)
