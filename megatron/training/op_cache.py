"""DeepSpeed's JIT-built op (its CPU shared-memory communication, loaded by every process-group
start): where its build is cached, which ninja builds it, and why a cached build is built again.

One build per cache: torch's JIT hands the build to ninja, which rebuilds when a command line,
an input's time or its own log differ from what it recorded. Two ninjas (Debian's 1.11 on PATH for
`make`, the venv's 1.13 in an activated shell) record command lines differently, so each rebuilt the
op for the other (87-211 s on 2 cores); the environment's own ninja now always comes first. A
copied or moved cache (new file times) is rebuilt once; `rebuild_reason` asks ninja beforehand
(`ninja -n -d explain`, a dry run) so the one line said after a slow start names why.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys


def set_op_cache_dir() -> None:
    """A persistent cache for the ops DeepSpeed JIT-builds on first use (~1 min), so later runs
    start in seconds; and the environment's own ninja first on PATH, whichever way Python was
    started (a plain `.venv/bin/python`, make, an activated venv, a Slurm job)."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(repo, ".venv", "torch_extensions"))
    bindir = os.path.dirname(sys.executable)
    path = os.environ.get("PATH", "").split(os.pathsep)
    if os.path.isfile(os.path.join(bindir, "ninja")) and path[:1] != [bindir]:
        os.environ["PATH"] = os.pathsep.join([bindir, *[p for p in path if p != bindir]])


def cached_builds() -> list[str]:
    """The op build directories in TORCH_EXTENSIONS_DIR that hold a built library."""
    cache = os.environ.get("TORCH_EXTENSIONS_DIR")
    if not cache:
        return []
    return sorted(os.path.dirname(p) for p in glob.glob(os.path.join(cache, "*", "build.ninja"))
                  if glob.glob(os.path.join(os.path.dirname(p), "*.so")))


def rebuild_reason(build_dir: str, timeout_s: float = 10.0) -> str | None:
    """Why ninja would build `build_dir` again (its first explanation), or None when it is up to date
    (or ninja cannot say: not installed, too slow)."""
    ninja = shutil.which("ninja")
    if ninja is None:
        return None
    try:
        proc = subprocess.run([ninja, "-C", build_dir, "-n", "-d", "explain"], capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    reasons = [line.split("ninja explain:", 1)[1].strip() for line in (proc.stdout + proc.stderr).splitlines()
               if "ninja explain:" in line and not line.rstrip().endswith(" is dirty")]
    return reasons[0] if reasons else None


def cache_state() -> tuple[bool, str | None]:
    """(whether a built op is cached, why ninja would rebuild it: None when it would not)."""
    builds = cached_builds()
    return bool(builds), next((r for r in map(rebuild_reason, builds) if r), None)
