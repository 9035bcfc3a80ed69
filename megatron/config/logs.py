"""Logging: stdout tee, TensorBoard, Weights & Biases, progress and the run directory.

(Named logs.py, not logging.py, so it never shadows the standard library module.)"""
from __future__ import annotations

from dataclasses import dataclass

from megatron.config.fields import key


@dataclass(frozen=True)
class LoggingConfig:
    log_dir: str | None = key(None, "Directory for stdout/stderr copies; not set = <run-dir>/logs, null = none.")
    tensorboard_dir: str | None = key(
        None, "TensorBoard event directory; not set = <run-dir>/tensorboard, null = no TensorBoard.")
    use_wandb: bool = key(False, "Log to Weights & Biases.")
    wandb_project: str = key("neox", "W&B project.")
    wandb_group: str | None = key(None, "W&B group.")
    wandb_team: str | None = key(None, "W&B entity (team).")
    wandb_run_name: str | None = key(None, "W&B run name.")
    wandb_host: str = key("https://api.wandb.ai", "NeoX's W&B server; W&B's own settings (`wandb login "
                          "--host`, WANDB_BASE_URL) choose it here.", inert=True)
    wandb_mode: str = key(
        "offline", "W&B stays offline unless you opt in with online.",
        choices=("offline", "online", "disabled"))
    log_interval: int = key(100, "Print and log training metrics every this many iterations.", ge=1)
    log_grad_norm: bool = key(False, "Log per-parameter gradient norms.")
    log_param_norm: bool = key(False, "Log per-parameter norms.")
    steps_per_print: int = key(10, "DeepSpeed's own progress print interval.", ge=1)
    wall_clock_breakdown: bool = key(False, "Time forward/backward/step separately.")
    progress_bar: bool = key(True, "Show a progress bar on rank 0.")
    run_dir: str | None = key(
        None, "Where the run writes: resolved config, original config files, metrics, and every "
        "output path not set (save, load, tensorboard-dir, log-dir); null = `save` if set, else "
        "runs/<first config file's name>.")

    def check(self) -> list[tuple[str, str]]:
        return []
