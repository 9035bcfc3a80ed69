"""The parallel layout of this process, passed explicitly to whatever needs it.

megatron-core keeps its process groups in module globals (parallel_state); we read them ONCE in
`init_parallel` into a ParallelContext and hand that object to the model, the trainer and
DeepSpeed (`deepspeed_mpu()`), so nothing else in our code reads megatron-core's globals.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from megatron.parallel.rng import TensorParallelRNG, check_sequence_parallel


@dataclass
class ParallelContext:
    tp_rank: int = 0
    tp_size: int = 1
    tp_group: Any = None  # None: no tensor parallelism (no group needed)
    dp_rank: int = 0
    dp_size: int = 1
    dp_group: Any = None  # None: the world group
    pp_rank: int = 0  # pipeline runs use DeepSpeed's topology instead: placeholders here
    pp_size: int = 1
    rng: TensorParallelRNG = field(default_factory=TensorParallelRNG)

    @classmethod
    def single(cls, dp_rank: int = 0, dp_size: int = 1) -> ParallelContext:
        """No tensor parallelism: every rank holds the whole model (plain data parallelism)."""
        return cls(dp_rank=dp_rank, dp_size=dp_size)

    @property
    def is_tensor_parallel(self) -> bool:
        return self.tp_size > 1

    def seed(self, seed: int) -> None:
        """Seed the TP dropout stream (seed + 2718 + tp_rank); the default stream is the caller's."""
        if self.is_tensor_parallel:
            self.rng.seed(seed, self.tp_rank)

    def megatron_config(self, params_dtype: torch.dtype = torch.float32):
        """megatron-core's layer config: CPU initialisation and no fused kernels (the flags
        measured to work on CPU/gloo, deps_measured.md section 2)."""
        from megatron.core import ModelParallelConfig  # lazy: megatron-core (~2 s to import), only for tensor parallelism

        return ModelParallelConfig(
            tensor_model_parallel_size=self.tp_size, sequence_parallel=False,
            use_cpu_initialization=True, perform_initialization=True,
            gradient_accumulation_fusion=False, params_dtype=params_dtype)

    def deepspeed_mpu(self):
        """The `mpu=` object for deepspeed.initialize; None without TP, so DeepSpeed builds its
        world-sized data-parallel group exactly as in a plain run."""
        return DeepSpeedMPU(self) if self.is_tensor_parallel else None


class DeepSpeedMPU:
    """The methods DeepSpeed 0.19.8 calls on `mpu` (engine.py, runtime/utils.py, utils/groups.py).

    Sequence-parallel getters are deliberately absent: DeepSpeed probes them with hasattr."""

    def __init__(self, ctx: ParallelContext):
        self.ctx = ctx
        self._tp_ranks = torch.distributed.get_process_group_ranks(ctx.tp_group)
        self._dp_ranks = torch.distributed.get_process_group_ranks(ctx.dp_group)

    # model parallel = tensor parallel here (no pipeline)
    def get_model_parallel_rank(self): return self.ctx.tp_rank
    def get_model_parallel_world_size(self): return self.ctx.tp_size
    def get_model_parallel_group(self): return self.ctx.tp_group
    get_tensor_model_parallel_rank = get_model_parallel_rank
    get_tensor_model_parallel_world_size = get_model_parallel_world_size
    get_tensor_model_parallel_group = get_model_parallel_group
    get_slice_parallel_rank = get_model_parallel_rank
    get_slice_parallel_world_size = get_model_parallel_world_size
    get_slice_parallel_group = get_model_parallel_group

    def get_tensor_model_parallel_src_rank(self): return self._tp_ranks[0]
    def get_data_parallel_rank(self): return self.ctx.dp_rank
    def get_data_parallel_world_size(self): return self.ctx.dp_size
    def get_data_parallel_group(self): return self.ctx.dp_group
    def get_data_parallel_group_ranks(self): return list(self._dp_ranks)
    def get_pipe_parallel_rank(self): return self.ctx.pp_rank
    def get_pipe_parallel_world_size(self): return self.ctx.pp_size
    get_pipeline_model_parallel_world_size = get_pipe_parallel_world_size

    def get_pipe_parallel_group(self):
        # Only the tensor-parallel (non-pipeline) engine gets this adapter: pipeline runs use
        # DeepSpeed's own topology, and pipeline + tensor parallelism is refused earlier.
        raise RuntimeError("the tensor-parallel mpu has no pipeline group (pipeline with tensor parallelism "
                           "is not supported yet)")
    get_pipeline_model_parallel_group = get_pipe_parallel_group


def init_parallel(tp_size: int, pp_size: int = 1, sequence_parallel: bool = False) -> ParallelContext:
    """Build the process groups with megatron-core after torch.distributed is initialised
    (megatron.process.distributed.init_distributed) and return this rank's context."""
    check_sequence_parallel(sequence_parallel)
    if pp_size != 1:
        raise ValueError(f"pipe-parallel-size {pp_size} with model-parallel-size {tp_size}: pipeline and tensor "
                         "parallelism together are not supported yet; use pipe-parallel-size 0 or 1 with "
                         "tensor parallelism")
    if not torch.distributed.is_initialized():
        raise ValueError("init_parallel needs torch.distributed: call init_distributed() first")
    world = torch.distributed.get_world_size()
    if world % tp_size:
        raise ValueError(f"model-parallel-size {tp_size} does not divide the {world} processes")
    from megatron.core import parallel_state as ps  # lazy: megatron-core, as in megatron_config

    if ps.model_parallel_is_initialized():  # a second model in the same process (tests)
        ps.destroy_model_parallel()
    ps.initialize_model_parallel(tensor_model_parallel_size=tp_size, create_gloo_process_groups=False)
    return ParallelContext(
        tp_rank=ps.get_tensor_model_parallel_rank(), tp_size=ps.get_tensor_model_parallel_world_size(),
        tp_group=ps.get_tensor_model_parallel_group(),
        dp_rank=ps.get_data_parallel_rank(), dp_size=ps.get_data_parallel_world_size(),
        dp_group=ps.get_data_parallel_group())


def context_for(cfg, dist_info) -> ParallelContext:
    """The trainer's context: megatron-core groups when model-parallel-size > 1, else plain data
    parallelism over all ranks (no groups built, so single-rank runs are unchanged)."""
    p = cfg.parallel
    check_sequence_parallel(p.sequence_parallel)
    if p.model_parallel_size > 1:
        ctx = init_parallel(p.model_parallel_size)
    else:
        ctx = ParallelContext.single(dp_rank=dist_info.rank, dp_size=dist_info.world_size)
    ctx.seed(cfg.training.seed)
    return ctx
