"""Process-group set-up. One process works without a launcher: we fill in the env variables
DeepSpeed expects (else it falls back to MPI discovery and asks for mpi4py)."""
from __future__ import annotations

import atexit
import os
import socket
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def set_single_process_env() -> None:
    for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(k, v)
    os.environ.setdefault("MASTER_PORT", str(free_port()))


def set_cpu_defaults() -> None:
    """On a machine without CUDA: DeepSpeed's CPU accelerator (gloo), and a persistent cache for
    the ops it JIT-builds on first use (~1 min), so later runs start in seconds."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(repo, ".venv", "torch_extensions"))


def init_distributed() -> DistInfo:
    set_cpu_defaults()
    set_single_process_env()
    import deepspeed

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)
        atexit.register(shutdown_distributed)
    rank = torch.distributed.get_rank()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    return DistInfo(rank, torch.distributed.get_world_size(), local_rank, device)


def shutdown_distributed() -> None:
    """Destroy the process group while the interpreter is still whole. Left to interpreter
    teardown, gloo's worker threads can outlive it and a rank that finished its work aborts with
    "terminate called without an active exception" (SIGABRT, pytorch/pytorch#190489): seen on
    2-rank CPU runs under load, the launcher then reports the whole run as failed."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
