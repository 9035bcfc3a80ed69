"""Where a run computes, and the process-group backend that goes with it, chosen together.

One rule for every entry point (training, evaluate.py, generate.py, eval.py, the HF export, the
benchmarks): `auto` is the GPU when torch sees one, else the CPU. `DS_ACCELERATOR=cpu` in the
environment is the user saying "this run's accelerator is the CPU" (DeepSpeed reads the same
variable), so `auto` honours it; an explicit `cuda` that contradicts it is refused rather than
half-obeyed.

The process-group backend follows the device, never `torch.cuda.is_available()`: nccl only moves
CUDA tensors, so a CPU run on a GPU machine gets gloo.
"""
from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from megatron.errors import UserError

if TYPE_CHECKING:  # torch is imported where it is used: `add_device_flag` serves CLIs before their heavy imports
    import torch  # lazy: torch; entry points import this module for --device before they parse flags

DEVICE_CHOICES = ("auto", "cpu", "cuda")
DEVICE_HELP = ("auto (the GPU when torch sees one, unless DS_ACCELERATOR=cpu is set; else the CPU), "
               "cpu, or cuda[:N]")
ACCELERATOR_ENV = "DS_ACCELERATOR"


class DeviceError(UserError):
    """A device that does not exist here, or one that contradicts DS_ACCELERATOR."""


def _accelerator_env() -> str | None:
    value = os.environ.get(ACCELERATOR_ENV, "").strip().lower()
    return value or None


def resolve_device(name: str | torch.device | None = "auto", what: str = "--device") -> torch.device:
    """'auto' | 'cpu' | 'cuda' | 'cuda:N' (or a torch.device) -> the torch.device to use.

    `what` names the setting in errors (`--device` for a CLI flag, `device:` for the config key)."""
    import torch  # lazy: torch; entry points import this module for --device before they parse flags

    text = "auto" if name is None else str(name).strip().lower()
    if text == "auto":
        if _accelerator_env() == "cpu" or not torch.cuda.is_available():
            return torch.device("cpu")
        return torch.device("cuda", torch.cuda.current_device())
    try:
        device = torch.device(text)
    except RuntimeError:
        raise DeviceError(f"{what} {name!r} is not a device; use {DEVICE_HELP}") from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type != "cuda":
        raise DeviceError(f"{what} {name!r}: only cpu and cuda are supported; use {DEVICE_HELP}")
    if not torch.cuda.is_available():
        raise DeviceError(f"{what} {name!r} but torch sees no GPU; use {what} cpu (or auto)")
    if _accelerator_env() == "cpu":
        raise DeviceError(f"{what} {name!r} contradicts {ACCELERATOR_ENV}=cpu in the environment: "
                          f"unset {ACCELERATOR_ENV} to use the GPU, or use {what} cpu")
    index = torch.cuda.current_device() if device.index is None else device.index
    if index >= torch.cuda.device_count():
        raise DeviceError(f"{what} {name!r}: torch sees {torch.cuda.device_count()} GPU(s) "
                          f"(cuda:0..cuda:{torch.cuda.device_count() - 1})")
    return torch.device("cuda", index)


def process_group_backend(device: torch.device, requested: str = "nccl") -> str:
    """nccl (or the requested backend) for CUDA tensors, gloo for CPU ones: nccl cannot move a
    CPU tensor ("No backend type associated with device type cpu")."""
    return requested if device.type == "cuda" else "gloo"


def select_deepspeed_accelerator(device: torch.device) -> None:
    """Make this process's DeepSpeed accelerator agree with `device`. Left to itself DeepSpeed picks
    CUDA whenever torch sees a GPU, and a CPU run on a GPU machine then fails in
    deepspeed.initialize; a process that already trained on one device (a test session) may also
    hold the other one."""
    from deepspeed.accelerator import real_accelerator  # lazy: DeepSpeed, only where a process group starts

    want = accelerator_name(device)
    current = real_accelerator.ds_accelerator
    if current is not None and current.device_name() == want:
        return
    if want == "cpu":
        from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator as Accelerator  # lazy: as above
    else:
        from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator as Accelerator  # lazy: as above
    real_accelerator.set_accelerator(Accelerator())


def accelerator_name(device: torch.device) -> str:
    """DeepSpeed's name for the accelerator of `device` (the value of DS_ACCELERATOR)."""
    return "cpu" if device.type == "cpu" else "cuda"


def worker_environment(device: torch.device) -> None:
    """DS_ACCELERATOR for the processes the DeepSpeed runner starts: they inherit this environment,
    and a worker's `auto` then resolves to the launcher's device."""
    os.environ[ACCELERATOR_ENV] = accelerator_name(device)


def describe(device: torch.device) -> str:
    """'cuda:0 (NVIDIA H100 80GB HBM3)' or 'cpu (N threads)': printed by every entry point at start."""
    import torch  # lazy: torch; entry points import this module for --device before they parse flags

    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return f"cpu ({torch.get_num_threads()} threads)"


def add_device_flag(parser, help_extra: str = "") -> None:
    """The `--device` flag of every entry point that runs a model, default auto."""
    parser.add_argument("--device", default="auto", help=f"where to run: {DEVICE_HELP}{help_extra}")


def device_from_flag(name: str, prog: str) -> torch.device:
    """`--device` resolved, and said once on stderr (stdout stays the program's output)."""
    device = resolve_device(name)
    print(f"{prog}: device {describe(device)}", file=sys.stderr, flush=True)
    return device


def collective_device() -> torch.device:
    """Where a tensor handed to the default process group's collectives must live: nccl moves CUDA
    tensors only, gloo (a CPU run) CPU ones. A flag or a loss built with torch.tensor(...) lands on
    the CPU, which nccl refuses as soon as there are two ranks."""
    import torch  # lazy: torch; entry points import this module for --device before they parse flags

    if torch.distributed.is_available() and torch.distributed.is_initialized() \
            and torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
