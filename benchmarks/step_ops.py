"""How many operations one training step dispatches, per positional scheme, outside the attention
kernel: on a GPU each is (at least) one kernel launch and some host time, so a scheme whose step
dispatches more of them than another's pays for it even where its attention kernel is as fast.

A TorchDispatchMode sees every aten operation of the step: the forward, the backward (the
autograd engine carries the mode into its threads), gradient clipping and the optimizer step.
The Triton attention kernels are not torch operations; their three launch sites in
megatron/attention/kernels/attention.py are wrapped (`counted_kernels`): each launch is counted,
and run for real on a GPU or replaced by a stand-in that launches nothing on a CPU (the wrapper's
own tensor work around the launch, its output buffers included, still runs and is counted, so the
count is the GPU's). FlexAttention's compiled kernel cannot run under the counting (torch.compile
refuses a dispatch mode): it is a counted stand-in on every device, forward only (what flex's
CPU path runs). Torch's own attention (SDPA: `none` and the other schemes without a bias) is
one operation per pass, counted as attention too.

What is counted as a kernel launch: every operation except views and allocations (`empty`,
`empty_like`, `detach`, ...), which launch nothing on a GPU. Host syncs: reads of a device
tensor's value (`aten::_local_scalar_dense`: item, bool, int, float), `tolist`, copies to the
host (`Tensor.cpu`), and operations whose output size depends on values (nonzero, masked_select,
unique), which make the host wait for the device; the optimizer's step counters are host tensors
(torch keeps them on the CPU) and are not counted. Each sync is recorded with where it came from
(`StepOps.where`: the innermost frames of our code). On a CPU every tensor is a host tensor, so
a read of one that stays on the host on a GPU too (a Python number wrapped by torch.tensor) is
counted as well: `where` tells them apart.

The count depends on the implementation torch picks for the device: on CUDA torch's AdamW and
clip_grad_norm_ default to their foreach kernels (one launch per group of tensors), on CPU
AdamW to a loop over parameters; `count_step(foreach=True)` asks for the foreach kernels on
the CPU too, so a CPU count has the GPU's shape."""
from __future__ import annotations

import contextlib
import os
import traceback
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from megatron.attention import flex

# Operations that launch no kernel on a GPU (allocations, autograd bookkeeping); views are
# recognised by their schema (OpOverload.is_view).
NO_KERNEL = {"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty",
             "aten::new_empty_strided", "aten::detach", "aten::alias", "aten::lift_fresh",
             "aten::_unsafe_view", "aten::_local_scalar_dense", "aten::set_", "aten::resize_"}
# Operations whose result the host must wait for: a value read, or an output sized by values.
SYNCS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::unique",
         "aten::_unique2", "aten::unique_consecutive", "aten::unique_dim", "aten::nonzero_static"}
# Torch's attention kernels (SDPA and its backends), counted as attention, not as overhead.
TORCH_ATTENTION = ("aten::_scaled_dot_product", "aten::_flash_attention", "aten::_efficient_attention",
                   "aten::_cudnn_attention")
TRITON_KERNELS = ("attention_fwd_kernel", "attention_bwd_dkdv_kernel", "attention_bwd_dq_kernel")
FLEX_KERNEL = "flex_attention"
# The Triton kernels' output arguments (their names in the kernels' signatures)
KERNEL_OUTPUTS = {"OUT", "LSE", "DK", "DV", "PART", "DQ"}


@dataclass
class StepOps:
    """What one step dispatched. `ops`: every operation by name, as dispatched; `launches`: the
    kernel launches outside the attention kernels; `attention`: attention kernel launches (ours
    by kernel name, torch's by op name); `syncs`: host syncs (what read the device) and `where`
    each came from (_where)."""

    ops: Counter = field(default_factory=Counter)
    attention: Counter = field(default_factory=Counter)
    syncs: list[str] = field(default_factory=list)
    where: list[str] = field(default_factory=list)

    def sync(self, name: str) -> None:
        self.syncs.append(name)
        self.where.append(_where())

    @property
    def launches(self) -> int:
        return sum(n for name, n in self.ops.items() if is_launch(name))

    def launch_ops(self) -> Counter:
        return Counter({name: n for name, n in self.ops.items() if is_launch(name)})


_VIEWS: set[str] = set()
_OURS = f"{os.sep}megatron{os.sep}"
_LIBRARY = f"site-packages{os.sep}"
_SKIP = (f"{os.sep}torch{os.sep}", f"benchmarks{os.sep}step_ops.py")


def _frame_name(filename: str, function: str) -> str | None:
    """'mask.consecutive_starts' for our code, 'deepspeed.runtime.utils.is_invalid_grad_norm' for a
    library's; None for torch, this file and anything else (scripts, tests, the standard library)."""
    if any(s in filename for s in _SKIP):
        return None
    if _OURS in filename:
        return f"{os.path.splitext(os.path.basename(filename))[0]}.{function}"
    if _LIBRARY in filename:
        return f"{os.path.splitext(filename.split(_LIBRARY)[-1])[0].replace(os.sep, '.')}.{function}"
    return None


def _where(depth: int = 6) -> str:
    """The innermost `depth` frames of our code (megatron/) or a library's (DeepSpeed's engine)
    on the stack, innermost first: 'mask.consecutive_starts <- triton.prepare <- attention.build
    <- pipeline._context'."""
    names = [n for f in reversed(traceback.extract_stack()) if (n := _frame_name(f.filename, f.name))]
    return " <- ".join(names[:depth])


def is_launch(name: str) -> bool:
    """Whether an operation launches a kernel on a GPU (the profiler's record_function markers,
    views and allocations do not)."""
    return not (name in NO_KERNEL or name in _VIEWS or name.startswith(("profiler::", *TORCH_ATTENTION)))


class _Recorder(TorchDispatchMode):
    def __init__(self, record: StepOps, host_tensors: set[int]):
        super().__init__()
        self.record, self.host = record, host_tensors

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if func.is_view:
            _VIEWS.add(name)
        if name.startswith(TORCH_ATTENTION):
            self.record.attention[name] += 1
        else:
            self.record.ops[name] += 1
        if name in SYNCS and not (args and id(args[0]) in self.host):
            self.record.sync(name)
        return func(*args, **(kwargs or {}))


class _Kernel:
    """A Triton kernel's launch site: `kernel[grid](...)` counts one launch into `counts`, and
    launches the real kernel only when `run` is True. A stand-in zeroes the kernel's outputs
    (uncounted): left as allocated they may hold NaN, and a NaN gradient norm makes DeepSpeed's
    optimizer skip its step, so the count would miss it."""

    def __init__(self, name: str, real, counts: Counter, run: bool):
        self.name, self.real, self.counts, self.run = name, real, counts, run

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.counts[self.name] += 1
            if self.run:
                return self.real[grid](*args, **kwargs)
            with _disable_current_modes():
                for name, arg in zip(self.real.arg_names, args):
                    if name in KERNEL_OUTPUTS:
                        arg.zero_()
            return None
        return launch


def _flex_stand_in(counts: Counter):
    """FlexAttention's kernel, counted as one launch and not run: torch.compile refuses to trace
    under a dispatch mode (on any device), and its eager path materialises the scores op by op.
    Returns an output of the right shape (B, H, Lq, Dv), uninitialised."""
    def flex_attention(q, k, v, **kwargs):
        counts[FLEX_KERNEL] += 1
        return q.new_empty((*q.shape[:-1], v.shape[-1]))
    return flex_attention


@contextlib.contextmanager
def counted_kernels(counts: Counter, run: bool):
    """The Triton attention kernels' launch sites wrapped for the duration (see _Kernel), and
    FlexAttention's kernel replaced by a counted stand-in (_flex_stand_in, on every device). With
    stand-ins (run False) the triton backend is allowed on a CPU too: nothing is launched or
    interpreted there, so its refusal (no CPU driver) does not apply."""
    # lazy: the Triton kernels read TRITON_INTERPRET once, when imported (attention/kernels/__init__.py)
    from megatron.attention import triton as backend
    from megatron.attention.kernels import attention as site

    saved = {name: getattr(site, name) for name in TRITON_KERNELS}
    interpreting = backend._interpreting
    flex_saved = flex._compiled_flex, flex.flex_attention
    try:
        for name, real in saved.items():
            setattr(site, name, _Kernel(name, real, counts, run))
        if not run:
            backend._interpreting = lambda: True
        stand_in = _flex_stand_in(counts)
        flex._compiled_flex, flex.flex_attention = (lambda: stand_in), stand_in
        yield
    finally:
        for name, real in saved.items():
            setattr(site, name, real)
        backend._interpreting = interpreting
        flex._compiled_flex, flex.flex_attention = flex_saved


@contextlib.contextmanager
def _host_reads_counted(record: StepOps, host: set[int]):
    """tolist reads values without an aten operation on the CPU (on CUDA it copies to the host
    first), and `cpu()` of a CPU tensor returns it without one (on CUDA it is a device-to-host
    copy, which waits for the device): each counted here as one sync per call on a non-host tensor."""
    originals = {name: getattr(torch.Tensor, name) for name in ("tolist", "cpu")}

    def counted(name, original):
        def read(self, *args, **kwargs):
            if id(self) not in host:
                record.sync(f"Tensor.{name}")
            return original(self, *args, **kwargs)
        return read

    try:
        for name, original in originals.items():
            setattr(torch.Tensor, name, counted(name, original))
        yield
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


@contextlib.contextmanager
def counting(record: StepOps, host_tensors: set[int] = frozenset()):
    """Everything dispatched and every host sync while inside, into `record` (count_step counts
    one call of a function with this; a caller whose step is not one call enters it itself)."""
    with _host_reads_counted(record, set(host_tensors)), _Recorder(record, set(host_tensors)):
        yield record


def count_step(step, optimizer: torch.optim.Optimizer | None, device: torch.device,
               warmup: int = 1) -> StepOps:
    """The operations of one call of `step` after `warmup` uncounted calls (the optimizer's state
    exists by then, as in every step but the first). Triton kernels launch only on CUDA; `step`
    builds its model inside counted_kernels (a CPU model resolves its backend on its first call)."""
    kernels = Counter()
    with counted_kernels(kernels, run=device.type == "cuda"):
        for _ in range(warmup):
            step()
        host = set()
        if optimizer is not None:  # its step counters: CPU tensors on every device
            host = {id(s["step"]) for s in optimizer.state.values() if torch.is_tensor(s.get("step"))}
        kernels.clear()
        record = StepOps()
        with counting(record, host):
            step()
    record.attention.update(kernels)
    return record


def use_foreach(optimizer: torch.optim.Optimizer) -> None:
    """Ask for torch's foreach kernels, CUDA's default (the CPU's default is a loop per tensor)."""
    optimizer.defaults["foreach"] = True
    for group in optimizer.param_groups:
        group["foreach"] = True
