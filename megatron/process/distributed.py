"""Process-group set-up. One process works without a launcher: we fill in the env variables
DeepSpeed expects (else it falls back to MPI discovery and asks for mpi4py)."""
from __future__ import annotations

import atexit
import datetime
import os
import re
import socket
from dataclasses import dataclass

import torch

from megatron.device import DeviceError, process_group_backend, resolve_device, select_deepspeed_accelerator
from megatron.errors import UserError
from megatron.process.heartbeat import start_heartbeat, stop_heartbeat
from megatron.process.op_cache import quiet_op_load, set_op_cache_dir
from megatron.process.ranks import launch_ranks, own_launch


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


def ranks_from_launcher(env=os.environ) -> None:
    """Under a launcher that starts the script itself (srun's tasks, mpirun's processes), each
    process's RANK, WORLD_SIZE and LOCAL_RANK from the launcher's own variables (megatron/process/
    ranks.py reads them and refuses contradictions, e.g. several processes that would each run as
    WORLD_SIZE=1), as torch's env:// rendezvous expects them; without them every process trained
    alone and the second found the run directory locked. MASTER_ADDR is the launcher's first host
    unless set (deepy.py sets it, and MASTER_PORT from the config: megatron/launchers/)."""
    launch_ranks(env)  # the contradictions, by name
    found = own_launch(env)
    if found is None:
        return
    launcher, (rank, world, local) = found
    env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"] = str(rank), str(world), str(local)
    if "MASTER_ADDR" not in env:
        env["MASTER_ADDR"] = launcher.first_host(env) or "127.0.0.1"
    env.setdefault("MASTER_PORT", "29500")  # the config's master-port default: deepy.py passes the config's


def init_distributed(device: str | torch.device = "auto", backend: str = "nccl", timeout_minutes: float = 30.0,
                     lost_host_timeout: float | None = None, describe_stop=None) -> DistInfo:
    """The process group and this rank's device, chosen together (megatron/device.py): `device` is
    the config's `device` key, `backend` its `distributed-backend` (used only for CUDA tensors),
    `timeout_minutes` its `distributed-timeout-minutes`. With several processes and a
    `lost_host_timeout` (seconds), the heartbeat (megatron/process/heartbeat.py) watches the
    other ranks; `describe_stop()` words what a stop keeps (the checkpoint `latest` names).

    One process joins an existing group if its backend fits the device; a test process that
    trained on the CPU and now trains on the GPU (or back) gets a new one."""
    set_op_cache_dir()
    ranks_from_launcher()
    set_single_process_env()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    chosen = resolve_device(device, what="device:")
    if chosen.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise DeviceError(f"rank with LOCAL_RANK {local_rank} needs GPU cuda:{local_rank}, but torch sees "
                              f"{torch.cuda.device_count()}: use num-gpus <= {torch.cuda.device_count()}, or device: cpu")
        chosen = torch.device("cuda", local_rank)
        torch.cuda.set_device(chosen)
    select_deepspeed_accelerator(chosen)
    wanted = process_group_backend(chosen, backend)
    if torch.distributed.is_initialized() and torch.distributed.get_backend() != wanted:
        if torch.distributed.get_world_size() > 1:
            raise RuntimeError(f"this process already joined a {torch.distributed.get_backend()} group of "
                               f"{torch.distributed.get_world_size()} ranks; a {chosen.type} run needs {wanted}")
        shutdown_distributed()
        os.environ["MASTER_PORT"] = str(free_port())  # the old group's store may still hold its port
    if not torch.distributed.is_initialized():
        import deepspeed  # lazy: DeepSpeed; evaluate.py imports this module (shutdown) without it

        with quiet_op_load("starting the process group", is_rank0=os.environ.get("RANK", "0") == "0"):
            try:
                deepspeed.init_distributed(dist_backend=wanted, auto_mpi_discovery=False,
                                           timeout=datetime.timedelta(minutes=timeout_minutes))
            except torch.distributed.DistError as e:
                raise ranks_missing(e, timeout_minutes) from None
        atexit.register(shutdown_distributed)
    info = DistInfo(torch.distributed.get_rank(), torch.distributed.get_world_size(), local_rank, chosen)
    if lost_host_timeout is not None:
        start_heartbeat(info.rank, info.world_size, lost_host_timeout, describe_stop)
    return info


def ranks_missing(error: Exception, timeout_minutes: float) -> UserError:
    """The one line for ranks that never met (torch's "Timed out ... waiting for clients. 1/2 clients
    joined" was a 43-line traceback): who is missing, where they were to meet, what to check."""
    env = os.environ
    world, rank = env.get("WORLD_SIZE", "?"), env.get("RANK", "?")
    where = f"{env.get('MASTER_ADDR', '?')}:{env.get('MASTER_PORT', '?')}"
    found = re.search(r"(\d+)/(\d+) clients joined", str(error))
    joined = f"{found.group(1)} of {found.group(2)} ranks joined" if found else f"the {world} ranks did not all meet"
    tasks = f", Slurm step of {env['SLURM_STEP_NUM_TASKS']} tasks on {env.get('SLURM_STEP_NODELIST', '?')}" \
        if env.get("SLURM_STEP_NUM_TASKS") else ""
    return UserError(f"rank {rank} of {world}: the process group did not form within distributed-timeout-minutes "
                     f"({timeout_minutes:g}): {joined} at the rendezvous {where}{tasks}. The missing ranks never "
                     "started, died at start (see their output), or cannot reach that address and port (MASTER_ADDR, "
                     "a firewall); check that every host runs its tasks and that WORLD_SIZE is the task count "
                     f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else 'no detail'})")


def shutdown_distributed() -> None:
    """Destroy the process group while the interpreter is still whole. Left to interpreter
    teardown, gloo's worker threads can outlive it and a rank that finished its work aborts with
    "terminate called without an active exception" (SIGABRT, pytorch/pytorch#190489): seen on
    2-rank CPU runs under load, the launcher then reports the whole run as failed."""
    stop_heartbeat()  # first: the others must not take the store's end for a lost host
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
