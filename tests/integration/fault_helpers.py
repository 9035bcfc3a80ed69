"""Run training in a child process and read its per-step losses back (metrics.jsonl)."""
from __future__ import annotations

import os
import subprocess
import sys

from megatron.errors import DataError
from megatron.process.distributed import free_port
from megatron.process.metrics_file import metrics_path, read_metrics
from tests.conftest import ROOT, write_yaml


def root_first_pythonpath(current: str | None) -> str:
    """The repository first, then whatever the parent had: on the GPU machine the packages come from
    the device bundle's PYTHONPATH (tools/device_bundle.py), so replacing it loses deepspeed."""
    rest = [p for p in (current or "").split(os.pathsep) if p and os.path.abspath(p) != ROOT]
    return os.pathsep.join([ROOT, *rest])


def child_env(accelerator: str | None = "cpu") -> dict:
    """The environment of a child train/deepy process: the parent's, with the repository on the path,
    no process-group variables (the child sets up its own), and DS_ACCELERATOR pinned to
    `accelerator` (None: unset, DeepSpeed picks the machine's own, the GPU tests)."""
    env = dict(os.environ)
    env.update(WANDB_MODE="disabled", PYTHONPATH=root_first_pythonpath(env.get("PYTHONPATH")),
               TORCH_EXTENSIONS_DIR=env.get("TORCH_EXTENSIONS_DIR", os.path.join(ROOT, ".venv", "torch_extensions")))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "DS_ACCELERATOR"):
        env.pop(k, None)
    if accelerator is not None:
        env["DS_ACCELERATOR"] = accelerator
    return env


def write_config(tmp_path, name: str, data: dict) -> str:
    return write_yaml(tmp_path / f"{name}.yml", data)


def start_deepy(config: str, *overrides: str, cwd=ROOT, port: int | None = None) -> subprocess.Popen:
    args = [sys.executable, os.path.join(ROOT, "deepy.py"), "train.py", config,
            "-o", f"master-port={port or free_port()}", *[x for o in overrides for x in ("-o", o)]]
    return subprocess.Popen(args, cwd=cwd, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def run_deepy(config: str, *overrides: str, timeout: int = 300, port: int | None = None) -> str:
    proc = start_deepy(config, *overrides, port=port)
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-4000:]
    return out


def train_losses(run_dir) -> dict[int, float]:
    """iteration -> lm_loss; when a crashed run repeated iterations, the last row wins."""
    losses = {}
    for row in read_metrics(metrics_path(str(run_dir))):
        if row["kind"] == "train":
            losses[row["iteration"]] = row["lm_loss"]
    return losses


def last_iteration(run_dir) -> int:
    try:
        return max(train_losses(run_dir), default=0)
    except (FileNotFoundError, DataError):
        return 0


def train_checkpoint(tmp, **over) -> tuple[dict, str]:
    """(config dict, checkpoint dir) of a tiny run trained in this process: 4 steps saved at 2 and
    4 (global_step2, global_step4, `latest` -> global_step4) unless `over` says otherwise."""
    from megatron.config import load_config
    from megatron.training.trainer import Trainer
    from tests.conftest import train_config_dict, write_token_dataset

    data = write_token_dataset(str(tmp / "tiny_text_document"))
    ck = str(tmp / "ck")
    conf = train_config_dict(tmp, data, **{"train_iters": 4, "save": ck, "save_interval": 2, "eval_iters": 1, **over})
    Trainer(load_config([write_yaml(tmp / "t.yml", conf)])).train()
    return conf, ck
