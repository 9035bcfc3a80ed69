"""Metrics sinks owned by the trainer (rank 0 only): console, a JSON-lines file with full
precision (`<run_dir>/metrics.jsonl`, one row per step or evaluation), TensorBoard, W&B.

TensorBoard writes to `tensorboard-dir`, or `<log-dir>/tensorboard`; W&B to `log-dir`, or the run
directory. Both get GPT-NeoX's tags (train/lm_loss, runtime/iteration_time, timers/forward, ...),
named by neox_names.py; metrics.jsonl keeps our names.

W&B runs offline unless the user opts in with `wandb_mode: online` (this stack must work on
machines with no network); `use_wandb: false` (the default) disables it entirely.
"""
from __future__ import annotations

import json
import os
import sys
from collections import defaultdict

from tqdm import tqdm

from megatron.process import neox_names
from megatron.process.metrics_file import metrics_path, trim_metrics


def tensorboard_dir(cfg) -> str | None:
    """tensorboard-dir (derived from run-dir unless set, megatron/config/paths.py); None: no TensorBoard."""
    return cfg.tensorboard_dir


# The console line's default keys (console-metrics: short), in this order; every key goes to the files.
SHORT_KEYS = ("lm_loss", "learning_rate", "grad_norm", "tokens_per_sec")
CURRENT_KEYS = ("learning_rate",)  # shown at the step's value, never averaged
# The rule above and below an evaluation's line: NeoX draws it as long as the line, which with the
# windows said at its end made 210-character rules that wrap into blocks of dashes on a terminal.
RULE_WIDTH = 100


# A process's first steps are slow (kernels built, caches and the allocator warmed) and one step's
# time moves with the machine's load: an ETA from the step just logged swung from 11 to 39 minutes
# in a quickstart's first minutes on a busy 2-core machine (issue 52). So the ETA is the mean time
# of this process's steps after its first ETA_WARMUP_STEPS, said once ETA_MIN_TIMED are timed.
ETA_WARMUP_STEPS = 2
ETA_MIN_TIMED = 4


def eta_seconds(steps_timed: int, seconds_timed: float, steps_left: int) -> float | None:
    """The time left at the mean of the timed steps; None until ETA_MIN_TIMED are timed (or none left)."""
    if steps_timed < ETA_MIN_TIMED or steps_left <= 0:
        return None
    return steps_left * seconds_timed / steps_timed


def format_eta(seconds: float) -> str:
    """'1d 02:03:04' / '02:03:04': a time left."""
    seconds = int(round(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    clock = f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"
    return f"{days}d {clock}" if days else clock


class MetricsLogger:
    def __init__(self, cfg, run_dir: str, enabled: bool = True, total_iters: int = 0, start_iter: int = 0,
                 sinks: bool = True):
        """`enabled`: this rank logs (rank 0); `sinks`: to metrics.jsonl, TensorBoard and W&B as well as
        the console (False: a finished run started again, which writes nothing)."""
        self.cfg = cfg.logging
        self.enabled = enabled
        self.tb = None
        self.wandb = None
        self.sums: dict[str, float] = defaultdict(float)
        self.count = 0
        self.steps_run, self.steps_timed, self.seconds_timed = 0, 0, 0.0  # this process's, for the ETA
        self.bar = None
        self.jsonl = None
        self.total_iters = total_iters
        if not (enabled and sinks):
            return
        os.makedirs(run_dir, exist_ok=True)
        # Appends, so a resumed run continues the same file; the rows of the steps it will redo
        # (logged after the checkpoint it resumes from) and a killed writer's half row are dropped
        # first, so each step appears once and no new row is glued onto half an old one.
        path = metrics_path(run_dir)
        trim_metrics(path, start_iter if start_iter > 0 else None)
        self.jsonl = open(path, "a")
        if self.cfg.progress_bar and total_iters > start_iter:
            self.bar = tqdm(total=total_iters, initial=start_iter, desc="train", dynamic_ncols=True,
                            file=sys.stdout, disable=None, mininterval=2.0)
        tb_dir = tensorboard_dir(self.cfg)
        if tb_dir:
            from torch.utils.tensorboard import SummaryWriter  # lazy: TensorBoard only when it is on

            # purge_step: a resumed run hides the events the interrupted one logged past its checkpoint
            self.tb = SummaryWriter(log_dir=tb_dir, purge_step=start_iter + 1 if start_iter else None)
        if self.cfg.use_wandb and self.cfg.wandb_mode != "disabled":
            self._init_wandb(cfg, self.cfg.log_dir or run_dir)

    def _init_wandb(self, cfg, wandb_dir: str) -> None:
        import wandb  # lazy: wandb only when it is on

        os.makedirs(wandb_dir, exist_ok=True)
        os.environ.setdefault("WANDB_DIR", wandb_dir)
        self.wandb = wandb.init(
            project=self.cfg.wandb_project, group=self.cfg.wandb_group, entity=self.cfg.wandb_team,
            name=self.cfg.wandb_run_name, mode=self.cfg.wandb_mode, dir=wandb_dir,
            config=cfg.to_flat_dict(),
        )

    def log_start(self, iteration: int, device: str, processes: int) -> None:
        """One `start` row per (re)start at the step it starts from: where the steps after it ran. The
        same seed on another CPU thread count or GPU trains differently (float sums in another order;
        docs/results/README.md), so a record names every device its run trained on (run_record.py)."""
        if self.enabled:
            import torch  # lazy: torch; eval.py's refusals import this module (through harness/run.py)

            self._row({"iteration": iteration, "kind": "start", "device": device, "processes": processes,
                       "torch": torch.__version__})

    def log_step(self, iteration: int, metrics: dict[str, float], detail: dict[str, float] | None = None) -> None:
        """Every step: TB/W&B get NeoX's tags (neox_names.step_tags); the console line averages
        `metrics` over log_interval and ends with an ETA; `detail` (per-parameter norms) goes to
        every sink but the console."""
        if not self.enabled:
            return
        everything = {**metrics, **(detail or {})}
        self._row({"iteration": iteration, "kind": "train", **everything})
        if "elapsed_time_per_iteration_ms" in metrics:
            self.steps_run += 1
            if self.steps_run > ETA_WARMUP_STEPS:
                self.steps_timed += 1
                self.seconds_timed += metrics["elapsed_time_per_iteration_ms"] / 1000
        for k, v in metrics.items():
            self.sums[k] += v
        self.log_tags(iteration, neox_names.step_tags(everything))
        self.count += 1
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{metrics.get('lm_loss', float('nan')):.3f}", refresh=False)
        if iteration % self.cfg.log_interval == 0:
            means = {k: v / self.count for k, v in self.sums.items()}
            # NeoX prints the learning rate the step used, not its mean over the interval
            means.update({k: metrics[k] for k in CURRENT_KEYS if k in metrics})
            self._console_line(iteration, means, self.count)
            self.sums.clear()
            self.count = 0
        elif iteration < self.cfg.log_interval and iteration & (iteration - 1) == 0:
            # Steps 1, 2, 4, 8, ... before the first interval: a new run shows that it trains and
            # how long it will take within seconds, not after log_interval steps (minutes on CPU).
            # This step's own values; the interval's average is still printed at log_interval.
            self._console_line(iteration, metrics, 1)

    def _console_line(self, iteration: int, values: dict[str, float], steps: int) -> None:
        """NeoX's line, `iteration N/T | key: value | ... | eta: ~hh:mm:ss |` (eta_seconds), short by
        default (console-metrics); a value averaged over `steps` > 1 says so."""
        shown = values if self.cfg.console_metrics == "all" else {k: values[k] for k in SHORT_KEYS if k in values}
        parts = [f"iteration {iteration}" + (f"/{self.total_iters}" if self.total_iters else "")]
        parts += [f"{k}{f' (mean of {steps})' if steps > 1 and k not in CURRENT_KEYS else ''}: {v:.4E}"
                  for k, v in shown.items()]
        eta = eta_seconds(self.steps_timed, self.seconds_timed, self.total_iters - iteration)
        if eta is not None:
            parts.append(f"eta: ~{format_eta(eta)}")
        self.console(" | ".join(parts) + " |")

    def log_eval(self, iteration: int, chart: str, metrics: dict[str, float], prefix: str,
                 console: bool = True, windows: str | None = None) -> None:
        """console False: the caller prints these figures itself (the harness's results table).
        `windows`: which windows the figures are on, said at the end of the line (a perplexity
        means nothing without them: evaluate.py's tables are on other windows)."""
        if not self.enabled:
            return
        self._row({"iteration": iteration, "kind": chart, **metrics})
        if console:
            line = (f" {chart} results at {prefix} | " + " | ".join(f"{k} value: {v:.6E}" for k, v in metrics.items())
                    + " |" + (f" on {windows} |" if windows else ""))
            rule = "-" * min(len(line), RULE_WIDTH)
            self.console(rule + "\n" + line + "\n" + rule)
        self.log_tags(iteration, neox_names.eval_tags(chart, metrics))

    def log_runtime(self, iteration: int, figures: dict[str, float]) -> None:
        """NeoX's runtime/* figures of a log interval (neox_runtime.py): TensorBoard and W&B only,
        as metrics.jsonl has each step's own speed."""
        self.log_tags(iteration, neox_names.runtime_tags(figures))

    def log_timers(self, iteration: int, seconds: dict[str, float]) -> None:
        """timers/* (seconds per step, the mean over the interval so far) to TensorBoard and W&B
        every step, and NeoX's `time (ms) | forward: ... |` console line at log-interval steps."""
        if not (self.enabled and seconds):
            return
        self.log_tags(iteration, neox_names.timer_tags(seconds))
        if iteration % self.cfg.log_interval == 0:
            self.console("time (ms) | " + " | ".join(f"{k}: {v * 1000:.2f}" for k, v in seconds.items()))

    def log_tags(self, iteration: int, tags: dict[str, float]) -> None:
        """The one place TensorBoard and W&B are written: both get the same tags at the same step."""
        if not (self.enabled and tags):
            return
        if self.tb:
            for k, v in tags.items():
                self.tb.add_scalar(k, v, iteration)
        if self.wandb:
            self.wandb.log(tags, step=iteration)

    def _row(self, row: dict) -> None:
        self.jsonl.write(json.dumps(row) + "\n")
        self.jsonl.flush()

    def console(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self.jsonl:
            self.jsonl.close()
            self.jsonl = None
        if self.bar is not None:
            self.bar.close()
        if self.tb:
            self.tb.close()
        if self.wandb:
            self.wandb.finish()
