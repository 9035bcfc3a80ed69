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

import contextlib
import glob
import os
import shutil
import subprocess
import sys
import time

from megatron.console import drop_op_built_line

# A JIT load slower than this compiled the op (a cached load takes well under a second).
COMPILED_OP_SECONDS = 5.0


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


@contextlib.contextmanager
def quiet_op_load(what: str, is_rank0: bool = True):
    """Drop DeepSpeed's "op built successfully" line printed inside the block, and say once (on rank
    0) when the block took long enough to have compiled the op: a first build, or a rebuild of a
    cached one with ninja's reason."""
    cached, reason = cache_state() if is_rank0 else (False, None)
    t0 = time.time()
    with drop_op_built_line():
        yield
    took = time.time() - t0
    if not is_rank0 or took <= COMPILED_OP_SECONDS or (cached and not reason):
        return  # fast, or slow for another reason than a build (the cached op was up to date)
    cache = os.environ.get("TORCH_EXTENSIONS_DIR", "TORCH_EXTENSIONS_DIR")
    if not cached:
        print(f"[deepspeed] {what} took {took:.0f}s (a first build of DeepSpeed's op; cached in {cache} for the "
              "next runs)", flush=True)
    else:
        print(f"[deepspeed] {what} took {took:.0f}s: DeepSpeed's op in {cache} was built again, because ninja "
              f"says: {reason} (a cache that was copied or moved, or built by another ninja or compiler, is "
              "rebuilt once; give each checkout its own TORCH_EXTENSIONS_DIR)", flush=True)
