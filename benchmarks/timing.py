"""Timing and memory probes that mean the same thing on CPU and CUDA.

CUDA launches are asynchronous, so a wall clock around a call measures the launch, not the
work: on CUDA every rep is bracketed by CUDA events and the stream is synchronised; on CPU the
work is done when the call returns and perf_counter is enough. The median of the reps is
reported (robust to one slow rep from a neighbouring job on a shared machine)."""
from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(fn: Callable[[], object], device: torch.device, warmup: int, reps: int) -> float:
    """Run fn `warmup` times untimed (compilation, autotuning, allocator growth), then `reps`
    times timed one by one; return the median seconds per call."""
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end) / 1000.0)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_gib(device: torch.device) -> float | None:
    """Peak bytes allocated by PyTorch on the GPU since the last reset, in GiB; None on CPU (the
    CPU allocator keeps no peak statistic, and an RSS delta mostly measures what glibc kept
    cached from earlier cells, so it is not reported)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return None


def call_peak_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes that fn() allocated through PyTorch above what was allocated when it started
    (whatever it frees before returning counts while alive). CUDA: the allocator's peak
    statistic. CPU, which keeps none (peak_memory_gib): the profiler's record of every allocation
    and free through PyTorch's CPU allocator in fn (each carries the running total since profiling
    began), kernels' scratch buffers included; memory a library allocates past that allocator
    (oneDNN's own, glibc's cache) is not seen. A probe of its own: one call, no timing."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - start

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.name == "[memory]":
            fields = node.extra_fields
            events.append((node.start_time_ns, fields.total_allocated, fields.alloc_size))
    if not events:
        return 0
    events.sort()
    # The running total counts from the first allocation seen while a profiler was on in this
    # process, so the baseline is the total just before fn's first event.
    base = events[0][1] - events[0][2]
    return max(total for _, total, _ in events) - base


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def error_cell(exc: BaseException, limit: int = 120) -> str:
    """What a table cell shows for a failed measurement: 'OOM' or 'error: Type: message'."""
    if is_oom(exc):
        return "OOM"
    msg = " ".join(str(exc).split())
    if len(msg) > limit:
        msg = msg[: limit - 3] + "..."
    return f"error: {type(exc).__name__}: {msg}" if msg else f"error: {type(exc).__name__}"


def release_memory(device: torch.device) -> None:
    """Return cached blocks after a cell (an OOM leaves the allocator fragmented)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
