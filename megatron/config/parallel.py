"""Parallelism layout and the DeepSpeed launcher's runner options."""
from __future__ import annotations

from dataclasses import dataclass

from megatron.config.fields import key
from megatron.device import DEVICE_CHOICES
from megatron.launchers import launcher_names, launchers


@dataclass(frozen=True)
class ParallelConfig:
    pipe_parallel_size: int = key(
        0, "Pipeline stages; 0 = plain sequential model, >= 1 = pipeline module (per-layer "
        "checkpoint files).", ge=0)
    model_parallel_size: int = key(1, "Tensor-parallel size.", ge=1)
    sequence_parallel: bool = key(False, "Megatron sequence parallelism (with tensor parallelism).")
    num_gpus: int | None = key(
        None, "Processes (GPUs) per node for the launcher; null = all visible, or the hostfile's slots. With "
        "a hostfile its slots decide: a num-gpus that disagrees with them is refused.", ge=1)
    num_nodes: int | None = key(None, "Nodes for the launcher; null = all in the hostfile.", ge=1)
    hostfile: str | None = key(
        None, "DeepSpeed hostfile (multi-node). A path that does not exist is DeepSpeed's runner's case: its "
        "warning, then training on this machine (NeoX's configs set /mock_path); refused with num-nodes > 1.")
    include: str | None = key(None, "DeepSpeed runner --include (hosts/GPUs to use).")
    exclude: str | None = key(None, "DeepSpeed runner --exclude (hosts/GPUs to skip).")
    master_addr: str | None = key(None, "Rendezvous address; null = the launcher's choice.")
    master_port: int = key(29500, "Rendezvous port.", ge=1, le=65535)
    launcher: str = key("pdsh", "Multi-node launcher, one of megatron/launchers/' files: " + "; ".join(
        f"{name} = {one.summary}" for name, one in launchers().items()) + ".", choices=launcher_names)
    device: str = key(
        "auto", "Where training computes: `auto` (the GPU when torch sees one, unless the environment "
        "sets DS_ACCELERATOR=cpu; else the CPU), `cpu` (also on a GPU machine: DeepSpeed's CPU "
        "accelerator, a gloo process group, one process unless num-gpus says more) or `cuda`. "
        "Evaluation and generation take the same choice as `--device`.",
        choices=DEVICE_CHOICES)
    distributed_timeout_minutes: float = key(
        30.0, "Process-group timeout (Megatron-LM's key): a collective that waits longer on a live but "
        "stuck rank fails. Carried to every host in the resolved config; torch's default is 30.", gt=0)
    lost_host_timeout: float = key(
        60.0, "Seconds without a heartbeat after which another rank's host counts as lost (crashed, or "
        "cut off the network): every surviving process then ends with one line naming the host and "
        "what `latest` holds, instead of waiting in a collective. Multi-process runs only.", gt=0)
    distributed_backend: str = key(
        "nccl", "torch.distributed backend of a GPU run; a CPU run (device: cpu, or no GPU) uses gloo "
        "whatever this says, since nccl cannot move CPU tensors.", choices=("nccl", "gloo"))

    def check(self) -> list[tuple[str, str]]:
        return []
