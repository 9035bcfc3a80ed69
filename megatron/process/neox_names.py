"""The one table from our metric names to the TensorBoard / W&B tags GPT-NeoX writes.

Why a table: NeoX dashboards and scripts look figures up by NeoX's tags, while metrics.jsonl keeps
our names (run records, reports and tests read it). Sources, in EleutherAI/gpt-neox:
megatron/logging.py `training_log` (train/*, runtime/*, gradient_norms/*, parameter_norms/*),
megatron/utils.py `Timers.write` (timers/*), megatron/training.py `evaluate_and_print_results`
(<chart>/<key>: validation/lm_loss, validation/lm_loss_ppl, test/...).

A figure NeoX does not have (grad_norm, param_norm, mfu, the positional statistics bias_*, ...)
keeps our name under `train/`, as every per-step figure had before; nothing is renamed into a
NeoX tag that NeoX computes differently.
"""
from __future__ import annotations

# Per-step keys whose NeoX tag differs only by the `train/` prefix are not listed: lm_loss ->
# train/lm_loss and learning_rate -> train/learning_rate (NeoX logs both every step).

# Per-parameter norms: NeoX's log_grad_norm / log_param_norm write these every step under these
# prefixes (our parameter names, not NeoX's module paths, follow the slash).
PREFIXES = {
    "grad_norm/": "gradient_norms/",
    "param_norm/": "parameter_norms/",
}

# Our per-step speed figures: NeoX logs speed only at log-interval steps, averaged over the
# interval (runtime/*, neox_runtime.py). Logging these per step too would put two differently
# averaged series beside each other, so they stay in metrics.jsonl and the console line only.
JSONL_ONLY = frozenset({"elapsed_time_per_iteration_ms", "samples_per_sec", "tokens_per_sec"})

RUNTIME_PREFIX = "runtime/"  # neox_runtime.IntervalRuntime's keys are NeoX's names after it
TIMERS_PREFIX = "timers/"  # timers.Timers' names are NeoX's (`batch generator` with its space)


def step_tags(metrics: dict[str, float]) -> dict[str, float]:
    """TensorBoard/W&B tags for one step's metrics.jsonl figures."""
    tags = {}
    for key, value in metrics.items():
        if key in JSONL_ONLY:
            continue
        prefix = next((p for p in PREFIXES if key.startswith(p)), None)
        tags[PREFIXES[prefix] + key[len(prefix):] if prefix else f"train/{key}"] = value
    return tags


def runtime_tags(figures: dict[str, float]) -> dict[str, float]:
    return {RUNTIME_PREFIX + k: v for k, v in figures.items()}


def timer_tags(seconds: dict[str, float]) -> dict[str, float]:
    return {TIMERS_PREFIX + k: v for k, v in seconds.items()}


def eval_tags(chart: str, metrics: dict[str, float]) -> dict[str, float]:
    """validation/lm_loss, test/lm_loss_ppl, harness/<task>/<metric>: already NeoX's."""
    return {f"{chart}/{k}": v for k, v in metrics.items()}
