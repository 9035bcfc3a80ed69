"""Launch configurations of the Triton attention kernels (block sizes, warps, stages), chosen per
(GPU name, dtype, head dim, length bucket, pass) and remembered in a JSON cache.

A pass is "fwd" (the forward kernel) or "bwd" (both backward kernels, which share one config).
A bwd config's block_n is the block each backward program keeps (keys in dk/dv, queries in dq) and
block_m the block it walks over: dq runs the mirror tile of dk/dv (LaunchConfig.dq_blocks). Both
kernels' tiles then have the kept block as the tensor cores' M side, which Hopper's warpgroup MMA
needs to be >= 64 (a 32-row side falls back to mma.sync, tools/sass_mix.py shows HMMA).
Where a configuration comes from, first match wins:
  1. KERPLE_TRITON_BLOCKS="fm,fn,bm,bn": fixed block sizes for every call (manual tuning);
  2. the interpreter (CPU tests): a fixed small configuration, so tests cross block boundaries;
  3. the cache: $KERPLE_TRITON_TUNE_CACHE, else $XDG_CACHE_HOME/kerple/triton_attention.json
     (default ~/.cache/...), one entry per key;
  4. with KERPLE_TRITON_AUTOTUNE=1: every candidate timed on the call's own tensors, the fastest
     stored in the cache (a candidate that does not fit the GPU is skipped);
  5. otherwise the untuned defaults below.
Parameter gradients are bitwise repeatable for a fixed configuration: the backward's partial sums
are laid out by its block size, so a cache entry, once written, keeps every later run identical.
The cache holds one small record per key and never grows with calls."""
from __future__ import annotations

import json
import os
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

PASSES = ("fwd", "bwd")
MIN_BUCKET, MAX_BUCKET = 128, 65536


@dataclass(frozen=True)
class LaunchConfig:
    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int | None = None  # None: Triton's default

    def dq_blocks(self) -> tuple[int, int]:
        """(BLOCK_M, BLOCK_N) of the dq kernel under a bwd config: the mirror of dk/dv's tile."""
        return self.block_n, self.block_m

    def launch_options(self) -> dict:
        """num_warps / num_stages keywords for kernel[grid](...)."""
        out = {"num_warps": self.num_warps}
        if self.num_stages is not None:
            out["num_stages"] = self.num_stages
        return out


INTERPRETER = {"fwd": LaunchConfig(16, 16), "bwd": LaunchConfig(16, 16)}


def default_config(pass_name: str, head_dim: int, dtype: torch.dtype | None = None) -> LaunchConfig:
    """The untuned choice, read off the kernels' sm_90 SASS (tools/sass_mix.py, no GPU timing yet):
    at head dim 64 and 128 these keep every kernel's inner loop free of register spills with
    warpgroup MMAs only. fwd: 128 queries on 8 warps (two warpgroups of 64 rows; 4 warps spilled
    at 128 x 64, and 64 x 64 on 4 warps had a stack at head dim 128). bwd: each program keeps 64
    rows (kernels/attention_bwd.py) and walks 32 at a time; a 64-row walk spilled in dk/dv.
    fp32 tiles are twice as large: the forward at head dim > 64 keeps 2 stages, not Triton's 3
    (on an H200 the table path's fp32 forward at head dim 128 asked 295,424 B of shared memory
    with 3, limit 232,448; 197,120 B with 2, compiled for sm_90 here)."""
    wide = dtype is not None and dtype.itemsize >= 4
    if pass_name == "fwd":
        return LaunchConfig(128, 64, 8, 2 if wide and head_dim > 64 else None)
    return LaunchConfig(32, 64)


def smaller_configs(cfg: LaunchConfig) -> list[LaunchConfig]:
    """What to launch instead when `cfg` needs more shared memory than the GPU has, in order: fewer
    pipeline stages first (the same tile, so the same partial-sum layout), then half the walked
    block, then half of both, never below 16. Used only after the GPU refused `cfg`."""
    m, n = cfg.block_m, cfg.block_n
    out = []
    for bm, bn in ((m, n), (m, n // 2), (m // 2, n // 2)):
        for stages in (2, 1):
            if bm < 16 or bn < 16 or ((bm, bn) == (m, n) and stages >= (cfg.num_stages or 3)):
                continue
            out.append(LaunchConfig(bm, bn, cfg.num_warps if bm >= 64 else 4, stages))
    return list(dict.fromkeys(out))


def candidates(pass_name: str, head_dim: int, dtype: torch.dtype | None = None) -> list[LaunchConfig]:
    """What autotuning tries: tiles that fit one SM's shared memory at this head dim, 4 or 8 warps,
    2-4 stages. The default is always among them. bwd tiles keep a block of >= 64 rows (the
    module docstring: a 32-row kept block is off the warpgroup MMA)."""
    big = head_dim > 64
    if pass_name == "fwd":
        blocks = [(64, 64), (128, 32), (128, 64)] + ([] if big else [(128, 128), (64, 128)])
    else:
        blocks = [(32, 64), (64, 64), (32, 128)] + ([] if big else [(128, 64), (64, 128)])
    out = [LaunchConfig(m, n, w, s) for m, n in blocks for w in (4, 8) for s in (2, 3, 4)]
    default = default_config(pass_name, head_dim, dtype)
    return out if default in out else [default, *out]


def length_bucket(length: int) -> int:
    """Lengths share a configuration within a power of two (512 and 600 -> 1024)."""
    bucket = 1 << max(int(length) - 1, 0).bit_length()
    return min(max(bucket, MIN_BUCKET), MAX_BUCKET)


def cache_key(pass_name: str, gpu: str, dtype: torch.dtype, head_dim: int, length: int) -> str:
    if pass_name not in PASSES:
        raise ValueError(f"unknown kernel pass {pass_name!r}; one of {PASSES}")
    return f"{gpu}|{str(dtype).removeprefix('torch.')}|d{head_dim}|L{length_bucket(length)}|{pass_name}"


def cache_path() -> str:
    explicit = os.environ.get("KERPLE_TRITON_TUNE_CACHE")
    if explicit:
        return explicit
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "kerple", "triton_attention.json")


def load_cache(path: str) -> dict[str, LaunchConfig]:
    """The cached entries; a missing file is empty, an unreadable one is ignored (it is a cache:
    the worst case is tuning again), entries of an unknown shape are dropped."""
    try:
        with open(path) as f:
            raw = json.load(f)
    except (OSError, ValueError):
        return {}
    out = {}
    for key, value in (raw.items() if isinstance(raw, dict) else ()):
        try:
            out[key] = LaunchConfig(**value)
        except TypeError:
            continue
    return out


def save_cache(path: str, entries: dict[str, LaunchConfig]) -> None:
    """Whole file to a temporary name, then renamed: a concurrent reader sees the old or the new."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({k: asdict(v) for k, v in sorted(entries.items())}, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def manual_blocks() -> dict[str, LaunchConfig] | None:
    """KERPLE_TRITON_BLOCKS="fm,fn,bm,bn", or None when unset."""
    env = os.environ.get("KERPLE_TRITON_BLOCKS")
    if not env:
        return None
    try:
        fm, fn, bm, bn = (int(x) for x in env.split(","))
    except ValueError:
        raise ValueError(f"KERPLE_TRITON_BLOCKS={env!r}: expected four integers 'fwd_m,fwd_n,bwd_m,bwd_n', "
                         "each a power of two >= 16") from None
    return {"fwd": LaunchConfig(fm, fn), "bwd": LaunchConfig(bm, bn)}


class Tuner:
    """Configurations for one process: the cache file read once, written when tuning adds to it."""

    def __init__(self, path: str | None = None):
        self.path = path or cache_path()
        self.entries: dict[str, LaunchConfig] | None = None
        self.fitted: dict[tuple[str, LaunchConfig], LaunchConfig] = {}  # refused config -> the one that ran

    def run_fitting(self, key: str, cfg: LaunchConfig, run: Callable[[LaunchConfig], object],
                    too_big: tuple[type[BaseException], ...]):
        """run(cfg)'s result; if the GPU refuses cfg (an exception in `too_big`: triton's
        OutOfResources), the first of smaller_configs(cfg) it accepts, remembered for this process
        and said once. A configuration that fits is never changed: bitwise repeatability holds."""
        chosen = self.fitted.get((key, cfg), cfg)
        try:
            return run(chosen)
        except too_big as e:
            if chosen != cfg:
                raise
            refused = e
        for smaller in smaller_configs(cfg):
            try:
                result = run(smaller)
            except too_big:
                continue
            self.fitted[(key, cfg)] = smaller
            warnings.warn(f"triton attention ({key}): {cfg} needs more GPU resources than this GPU has "
                          f"({str(refused).splitlines()[0][:160]}); running {smaller} instead. "
                          "KERPLE_TRITON_AUTOTUNE=1 times the candidates that fit and caches the fastest.",
                          stacklevel=2)
            return result
        raise refused

    def config(self, pass_name: str, gpu: str, dtype: torch.dtype, head_dim: int, length: int,
               measure: Callable[[LaunchConfig], float] | None = None, interpreter: bool = False) -> LaunchConfig:
        """The configuration for this call (module docstring: the order). `measure(config)` ->
        seconds runs the pass once with that configuration; it is called only when tuning."""
        manual = manual_blocks()
        if manual is not None:
            return manual[pass_name]
        if interpreter:
            return INTERPRETER[pass_name]
        if self.entries is None:
            self.entries = load_cache(self.path)
        key = cache_key(pass_name, gpu, dtype, head_dim, length)
        if key in self.entries:
            return self.entries[key]
        if measure is None or os.environ.get("KERPLE_TRITON_AUTOTUNE", "0") != "1":
            return default_config(pass_name, head_dim, dtype)
        best = fastest(candidates(pass_name, head_dim, dtype), measure)
        self.entries = {**load_cache(self.path), key: best}  # keep what another process added
        save_cache(self.path, self.entries)
        return best


def fastest(configs: list[LaunchConfig], measure: Callable[[LaunchConfig], float]) -> LaunchConfig:
    """The config with the smallest measured time; one that fails to launch (too much shared
    memory, too many registers on this GPU) is skipped. Ties keep the earlier (the list order)."""
    best, best_s, errors = None, float("inf"), []
    for cfg in configs:
        try:
            seconds = measure(cfg)
        except Exception as e:  # triton's OutOfResources and friends: this GPU cannot run it
            errors.append(f"{cfg}: {type(e).__name__}: {e}")
            continue
        if seconds < best_s:
            best, best_s = cfg, seconds
    if best is None:
        raise RuntimeError("no kernel configuration could run:\n" + "\n".join(errors))
    return best
