"""The nested sections' own keys (optimizer, zero_optimization), checked like flat keys: every
unknown one named at once, with its path, the file it came from (the caller adds that) and a close
match. Without this `zero_optimization: {stag: 1}` passed --dry-run and died later in DeepSpeed's
own words, and `optimizer.params.lrr` was reported only as "lr must be a number > 0, got None"."""
from __future__ import annotations

from megatron.config.errors import close_matches

# DeepSpeedZeroConfig's fields and their aliases (deepspeed/runtime/zero/config.py, DeepSpeed
# 0.19.8). Written out, not imported: reading a config must not import DeepSpeed;
# tests/unit/test_nested_sections.py keeps it equal to the installed DeepSpeed's.
ZERO_KEYS = (
    "allgather_bucket_size", "allgather_partitions", "allgather_sequential", "compute_grad_norm",
    "contiguous_gradients", "cpu_offload", "cpu_offload_param", "cpu_offload_use_pin_memory", "elastic_checkpoint",
    "enable_sanity_checks", "gather_16bit_weights_on_model_save", "ignore_unused_parameters", "leaf_module",
    "legacy_stage1", "load_from_fp32_weights", "log_trace_cache_warnings", "max_live_parameters", "max_reuse_distance",
    "memory_efficient_linear", "model_persistence_threshold", "module_granularity_threshold", "offload_optimizer",
    "offload_param", "overlap_comm", "override_module_apply", "param_persistence_threshold", "parameter_alignment",
    "pipeline_loading_checkpoint", "prefetch_bucket_size", "reduce_bucket_size", "reduce_scatter",
    "round_robin_gradients", "save_muon_momentum_buffer_in_memory", "stage", "stage3_allgather_sequential",
    "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
    "stage3_max_live_parameters", "stage3_max_reuse_distance", "stage3_model_persistence_threshold",
    "stage3_module_granularity_threshold", "stage3_param_persistence_threshold", "stage3_prefetch_bucket_size",
    "stage3_use_all_reduce_for_fetch_params", "sub_group_size", "use_all_reduce_for_fetch_params",
    "use_multi_rank_bucket_allreduce", "zenflow", "zero_hpz_partition_size", "zero_quantized_gradients",
    "zero_quantized_nontrainable_weights", "zero_quantized_weights")
OPTIMIZER_KEYS = ("type", "params")
# What our optimizers read (megatron/training/optim.py); weight decay is NeoX's flat weight-decay.
OPTIMIZER_PARAMS = {"adam": ("lr", "betas", "eps"), "adamw": ("lr", "betas", "eps"), "sgd": ("lr", "momentum")}


def unknown_keys(section: dict, known, path: str) -> list[str]:
    """'path.key: unknown; did you mean path.close?' for each key of `section` not in `known`."""
    out = []
    for key in section:
        if key in known:
            continue
        close = close_matches(str(key), list(known), n=1)
        hint = f"; did you mean {path}.{close[0]}?" if close else f"; known: {', '.join(known)}"
        out.append(f"unknown key {path}.{key}{hint}")
    return out


def optimizer_key_problems(opt: dict) -> list[str]:
    out = unknown_keys(opt, OPTIMIZER_KEYS, "optimizer")
    kind = str(opt.get("type", "")).lower()
    params = opt.get("params")
    if kind in OPTIMIZER_PARAMS and isinstance(params, dict):
        out += unknown_keys(params, OPTIMIZER_PARAMS[kind], "optimizer.params")
    return out


def zero_key_problems(zero: dict) -> list[str]:
    return unknown_keys(zero, ZERO_KEYS, "zero_optimization")
