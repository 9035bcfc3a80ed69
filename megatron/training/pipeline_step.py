"""Training with DeepSpeed's pipeline engine (NeoX: pipe-parallel-size >= 1, even 1 stage).

pipe-parallel-size 0 keeps the plain sequential GPTModel path. With >= 1 the model is GPTPipe,
the engine runs whole batches (`train_batch` pulls gas micro-batches from an iterator on the
first and last stages), and the data-parallel size is world / (pipe * model).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import torch

from megatron.data.loader import loss_mask_for


def uses_pipeline(cfg) -> bool:
    return cfg.parallel.pipe_parallel_size >= 1


def pipeline_topology(cfg, world_size: int):
    # lazy: DeepSpeed picks (and logs) its accelerator on import: after init_distributed chose one
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    pp, mp = cfg.parallel.pipe_parallel_size, cfg.parallel.model_parallel_size
    if world_size % (pp * mp):
        raise ValueError(f"world size {world_size} is not divisible by pipe-parallel-size {pp} x "
                         f"model-parallel-size {mp}")
    # The `model` axis (even of size 1) makes DeepSpeed name layer files NeoX's way:
    # layer_XX-model_YY-model_states.pt.
    return PipeModelDataParallelTopology(num_pp=pp, num_mp=mp, num_dp=world_size // (pp * mp))


def _check_zero(cfg) -> None:
    stage = (cfg.optimizer.zero_optimization or {}).get("stage", 0)
    if stage >= 2:
        raise ValueError(f"zero_optimization.stage {stage} cannot be combined with pipe-parallel-size >= 1 "
                         "(DeepSpeed's pipeline engine supports ZeRO stage 0 or 1)")


def build_pipeline_engine(cfg, vocab_size: int, optimizer_factory: Callable, scheduler_factory: Callable):
    """(engine, GPTPipe). Call after seeding, as for GPTModel: the initial weights are the same.
    optimizer_factory(module) -> optimizer; scheduler_factory(optimizer) -> scheduler."""
    # lazy: as in pipeline_topology; GPTPipe is DeepSpeed's PipelineModule
    import deepspeed

    from megatron.parallel.pipeline import GPTPipe

    _check_zero(cfg)
    topology = pipeline_topology(cfg, torch.distributed.get_world_size())
    t = cfg.training
    module = GPTPipe(cfg.model, vocab_size, topology, t.checkpoint_activations, t.checkpoint_num_layers)
    optimizer = optimizer_factory(module)
    engine, _, _, _ = deepspeed.initialize(
        model=module, optimizer=optimizer, lr_scheduler=scheduler_factory(optimizer),
        config=cfg.deepspeed_config(topology.get_dim("data")), dist_init_required=False,
    )
    return engine, module


def data_parallel_info(engine) -> tuple[int, int]:
    """(dp rank, dp size) for the batch loader: every stage of one pipeline reads the same data."""
    return engine.grid.get_data_parallel_rank(), engine.grid.get_data_parallel_world_size()


def pipe_batches(loader: Iterable[dict], eod: int | None, eod_mask_loss: bool) -> Iterator[tuple]:
    """Our micro-batches {"tokens", "labels"} -> the pipe engine's ((tokens,), (labels, loss_mask))."""
    for batch in loader:
        tokens = batch["tokens"]
        yield (tokens,), (batch["labels"], loss_mask_for(tokens, eod, eod_mask_loss))


def pipeline_train_step(engine, data_iter: Iterator) -> float:
    """One optimizer step over gas micro-batches; the loss is averaged over them and over DP."""
    return float(engine.train_batch(data_iter))


@torch.no_grad()
def pipeline_eval_step(engine, data_iter: Iterator) -> float:
    """Mean loss of gas micro-batches (the same on every rank)."""
    # The engine sends activation shapes between stages only once; evaluation may run at another
    # length (seq-length-val), so make it re-send them now and again at the next train_batch.
    engine.reset_activation_shape()
    try:
        return float(engine.eval_batch(data_iter))
    finally:
        engine.reset_activation_shape()
