#!/usr/bin/env python
"""The paper's config through `deepy.py` as a user launches it, timed: tokens/s and MFU.

configs/paper/local_setup.yml + train.yml (162M, seq 512, micro-batch 32, bf16 through DeepSpeed,
activation checkpointing) on random tokens of GPT-2's padded vocabulary (50,304), so the output
layer costs what it costs the paper's model; no tokenizer files are needed. train.py logs
tokens_per_sec and mfu every --log-interval steps into the run's metrics.jsonl; the first window
holds compilation and warmup, so the figure is the median of the later ones. Writes --out (JSON).

    python tools/gpu_throughput.py --out throughput.json           # on a GPU (tools/gpu_check.py runs it)
    python tools/gpu_throughput.py --out throughput.json --tiny    # a toy model on the CPU, the plumbing
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import yaml

from benchmarks.corpus import VOCAB, write_corpus
from megatron.cli_args import ArgumentParser

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PAPER = ["configs/paper/local_setup.yml", "configs/paper/train.yml"]
TINY = {"num-layers": 2, "hidden-size": 64, "num-attention-heads": 4, "seq-length": 64,
        "max-position-embeddings": 64, "seq-length-val": 64, "train_micro_batch_size_per_gpu": 2,
        "checkpoint-activations": False, "partition-activations": False, "device": "cpu",
        "fp16": {"enabled": False}}


def experiment(tmp: str, iters: int, log_interval: int, tiny: bool) -> str:
    steps_tokens = (TINY["train_micro_batch_size_per_gpu"] * TINY["seq-length"]) if tiny else 32 * 512
    data = write_corpus(os.path.join(tmp, "random_text_document"), 2 * iters * steps_tokens + 65536,
                        512 if tiny else VOCAB)
    exp = {"data-path": data, "tokenizer-type": "CharLevelTokenizer", "padded-vocab-size": 512 if tiny else VOCAB,
           "train-iters": iters, "lr-decay-iters": iters, "log-interval": log_interval, "eval-interval": 10**6,
           "eval-iters": 0, "save-interval": 10**6, "run-dir": os.path.join(tmp, "run"), "num-workers": 0,
           "tensorboard-dir": os.path.join(tmp, "tensorboard"),  # local_setup.yml's is relative to the checkout
           "split": "100,0,0", "progress-bar": False, "use_wandb": False, **(TINY if tiny else {})}
    path = os.path.join(tmp, "throughput.yml")
    with open(path, "w") as f:
        yaml.safe_dump(exp, f)
    return path


def summarize(metrics_path: str) -> dict:
    rows = [json.loads(line) for line in open(metrics_path)]
    train = [r for r in rows if r.get("kind") == "train" and "tokens_per_sec" in r]
    if not train:
        raise RuntimeError(f"{metrics_path}: no train rows with tokens_per_sec")
    later = train[1:] or train  # the first window holds compilation and warmup
    out = {"windows": len(train), "tokens_per_sec": statistics.median(r["tokens_per_sec"] for r in later),
           "tokens_per_sec_all": [round(r["tokens_per_sec"]) for r in train],
           "last_iteration": train[-1]["iteration"], "lm_loss_last": train[-1].get("lm_loss")}
    mfu = [r["mfu"] for r in later if r.get("mfu") is not None]
    out["mfu"] = statistics.median(mfu) if mfu else None
    return out


def main() -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--iters", type=int, default=None, help="training steps (default 40; --tiny 4)")
    p.add_argument("--log-interval", type=int, default=None, help="steps per logged window (default 10; --tiny 2)")
    p.add_argument("--tiny", action="store_true", help="a toy model on the CPU: the plumbing, not a figure")
    args = p.parse_args()
    iters = args.iters or (4 if args.tiny else 40)
    log_interval = args.log_interval or (2 if args.tiny else 10)
    if iters < 2 * log_interval:
        p.error(f"--iters {iters} must be at least twice --log-interval {log_interval} (the first window is warmup)")
    # lazy: pulls in torch (process/distributed.py); --help and flag errors need none
    from megatron.process.distributed import free_port

    with tempfile.TemporaryDirectory(prefix="gpu_throughput_") as tmp:
        exp = experiment(tmp, iters, log_interval, args.tiny)
        cmd = [sys.executable, "deepy.py", "train.py", *PAPER, exp, "-o", f"master-port={free_port()}"]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if not args.tiny:
            env.pop("DS_ACCELERATOR", None)  # `auto` means the GPU, as for a user
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        sys.stdout.write(proc.stdout[-6000:])
        sys.stderr.write(proc.stderr[-6000:])
        result = {"command": " ".join(cmd[1:]), "configs": PAPER, "tiny": args.tiny, "rc": proc.returncode,
                  "iters": iters, "log_interval": log_interval}
        metrics = os.path.join(tmp, "run", "metrics.jsonl")
        if proc.returncode == 0 and os.path.exists(metrics):
            result.update(summarize(metrics))
        device = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip().startswith("device ")]
        result["device_line"] = device[0].strip() if device else None
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "tokens_per_sec_all"}))
    return 0 if proc.returncode == 0 else 1
