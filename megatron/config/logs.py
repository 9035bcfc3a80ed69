"""Logging: stdout tee, TensorBoard, Weights & Biases, progress and the run directory.

(Named logs.py, not logging.py, so it never shadows the standard library module.)"""
from __future__ import annotations

from dataclasses import dataclass

from megatron.config.fields import key


@dataclass(frozen=True)
class LoggingConfig:
    log_dir: str | None = key(
        None, "Where W&B's files go; not set = <run-dir>/logs, null = W&B in the run directory.")
    tensorboard_dir: str | None = key(
        None, "TensorBoard event directory; not set = <run-dir>/tensorboard, null = no TensorBoard. "
        "TensorBoard and W&B get GPT-NeoX's metric names (train/lm_loss, runtime/iteration_time, "
        "timers/forward, ...; docs/launching.md, Metrics); metrics.jsonl keeps this stack's.")
    use_wandb: bool = key(False, "Log to Weights & Biases (the same names as TensorBoard).")
    wandb_project: str = key("neox", "W&B project.")
    wandb_group: str | None = key(None, "W&B group.")
    wandb_team: str | None = key(None, "W&B entity (team).")
    wandb_run_name: str | None = key(None, "W&B run name.")
    wandb_host: str = key("https://api.wandb.ai", "NeoX's W&B server; W&B's own settings (`wandb login "
                          "--host`, WANDB_BASE_URL) choose it here.", inert=True)
    wandb_mode: str = key(
        "offline", "W&B stays offline unless you opt in with online.",
        choices=("offline", "online", "disabled"))
    log_interval: int = key(100, "Print and log training metrics every this many iterations (the console line averages "
                            "them); before the first interval also at iterations 1, 2, 4, 8, ...; the ETA once 4 steps after "
                            "the process's first 2 are timed. "
                            "NeoX's runtime/* figures (TensorBoard, W&B) are logged at these iterations, over the "
                            "interval's wall clock.", ge=1)
    console_metrics: str = key(
        "short", "Our key: which training metrics the console line shows. short: the loss (the mean over the "
        "interval, labelled so), the current learning rate, the gradient norm (mean) and tokens/s, then the ETA; "
        "all: every metric of the step (the KERPLE parameters' statistics, MFU, ...). metrics.jsonl, TensorBoard "
        "and W&B get every metric either way.", choices=("short", "all"))
    log_grad_norm: bool = key(
        False, "Also log each parameter's gradient norm (grad_norm/<name>, before clipping) to "
        "metrics.jsonl, and as NeoX's gradient_norms/<name> to TensorBoard and W&B; the global gradient "
        "norm (grad_norm) is always logged. Not with pipe-parallel-size >= 1; with tensor parallelism, rank 0's shards.")
    log_param_norm: bool = key(
        False, "Log the global parameter norm (param_norm) every step, and each parameter's "
        "(param_norm/<name>) to metrics.jsonl, and as NeoX's parameter_norms/<name> to TensorBoard and "
        "W&B; one pass over the weights (a gather under ZeRO-3), so off by default.")
    steps_per_print: int = key(10, "DeepSpeed's own progress print interval.", ge=1)
    wall_clock_breakdown: bool = key(
        False, "Time forward, backward, optimizer and batch generator separately: NeoX's timers/<name> in "
        "TensorBoard and W&B (seconds per iteration, the mean over the log interval so far) and a `time (ms)` "
        "line each log interval; DeepSpeed prints its own breakdown too. Synchronizes CUDA around each part, "
        "so it slows training. No timers/* with pipe-parallel-size >= 1.")
    progress_bar: bool = key(True, "Show a progress bar on rank 0.")
    run_dir: str | None = key(
        None, "Where the run writes: resolved config, original config files, metrics, and every "
        "output path not set (save, load, tensorboard-dir, log-dir); null = `save` if set, else "
        "runs/<first config file's name>.")

    def check(self) -> list[tuple[str, str]]:
        return []
