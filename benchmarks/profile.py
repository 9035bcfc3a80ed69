"""Where a step's time goes: torch.profiler over a few calls of `step`, each kernel's device time
(on CPU: each operator's own CPU time) per call, grouped into categories a reader can compare
across positional schemes (tools/bench_train_step.py --profile). It answers what a ratio cannot:
which kernels make KERPLE-log's training step slower than ALiBi's."""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.report import markdown_table

# (category, substrings of a kernel's name, lower case), first match wins; the rest is "other".
CATEGORIES = [
    ("attention fwd (ours)", ("attention_fwd_kernel",)),
    ("attention bwd dk/dv (ours)", ("attention_bwd_dkdv",)),
    ("attention bwd dq (ours)", ("attention_bwd_dq",)),
    ("attention (torch: sdpa, flash, flex)", ("flash", "fmha", "sdpa", "efficient_attention", "flex",
                                              "scaled_dot_product")),
    ("matmul", ("gemm", "xmma", "cutlass", "nvjet", "cublas", "aten::mm", "aten::addmm", "aten::bmm",
                "aten::linear", "aten::matmul")),
    ("optimizer", ("multi_tensor", "adam", "foreach")),
    ("copies and memsets", ("memcpy", "memset", "copy_", "aten::to", "aten::contiguous")),
]
OTHER = "other (elementwise, reductions, ...)"


def category(name: str) -> str:
    low = name.lower()
    return next((c for c, keys in CATEGORIES if any(k in low for k in keys)), OTHER)


def kernel_times(step: Callable[[], None], device: torch.device, calls: int = 3) -> dict[str, float]:
    """Seconds per call of `step` by kernel name (CUDA: device time of each kernel; CPU: each
    operator's self time). One untraced call first, so the trace holds no compilation."""
    cuda = device.type == "cuda"
    step()
    if cuda:
        torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            step()
        if cuda:
            torch.cuda.synchronize(device)
    out: dict[str, float] = defaultdict(float)
    for evt in prof.events():
        if cuda and evt.device_type != torch.autograd.DeviceType.CPU:
            out[evt.name] += evt.device_time_total / 1e6 / calls
        elif not cuda and evt.device_type == torch.autograd.DeviceType.CPU:
            out[evt.name] += evt.self_cpu_time_total / 1e6 / calls
    return dict(out)


def by_category(times: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for name, seconds in times.items():
        out[category(name)] += seconds
    return dict(out)


def short(name: str, width: int = 70) -> str:
    name = " ".join(name.split()).replace("|", "/")
    return name if len(name) <= width else name[: width - 3] + "..."


def profile_tables(profiles: dict[str, dict[str, float]], wall: dict[str, float] | None = None,
                   top: int = 10) -> str:
    """Markdown: ms per step by category, one column per scheme (the total, and with `wall` the
    timed seconds per step and what the profiled work leaves of it: on a GPU, time the device sat
    idle waiting for the host), then the first scheme's `top` kernels with the same kernels'
    time in the others."""
    schemes = list(profiles)
    cats = {s: by_category(t) for s, t in profiles.items()}
    names = [c for c, _ in CATEGORIES] + [OTHER]
    rows = [[c, *[f"{cats[s].get(c, 0.0) * 1e3:.2f}" for s in schemes]] for c in names
            if any(cats[s].get(c, 0.0) > 0 for s in schemes)]
    rows.append(["**total**", *[f"**{sum(profiles[s].values()) * 1e3:.2f}**" for s in schemes]])
    if wall:
        rows.append(["wall clock (the timed median)", *[f"{wall[s] * 1e3:.2f}" if s in wall else "-" for s in schemes]])
        rows.append(["wall clock - total", *[f"{(wall[s] - sum(profiles[s].values())) * 1e3:.2f}" if s in wall else "-"
                                             for s in schemes]])
    right = set(range(1, len(schemes) + 1))
    text = markdown_table(["ms per step", *schemes], rows, right=right)
    first = schemes[0]
    heavy = sorted(profiles[first].items(), key=lambda kv: -kv[1])[:top]
    krows = [[f"`{short(n)}`", category(n), *[f"{profiles[s].get(n, 0.0) * 1e3:.2f}" for s in schemes]]
             for n, _ in heavy]
    text += "\n\n" + markdown_table([f"{first}'s {len(heavy)} heaviest", "category", *schemes], krows,
                                    right=set(range(2, len(schemes) + 2)))
    return text
