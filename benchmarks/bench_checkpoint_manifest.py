"""What the checkpoint manifest (megatron/checkpoint/manifest.py) costs a save, on the 162M model.

The paper's 162M GPT (configs/paper/local_setup.yml + train.yml: DeepSpeed pipeline engine, one
stage, bf16 with fp32 master weights and Adam moments) is built on the CPU with its optimizer
state filled in (as after a step), and saved by training's Checkpointer: with the manifest, and
with `write_manifest` replaced by a no-op, alternating which goes first, in one process. The table
gives the median save time of each and their ratio (on a shared machine mostly noise: a 4 GB save
varies by 2x from one to the next), the time spent in write_manifest inside each save (the
manifest's cost, free of that noise), its size, and what checking it costs a read (every file
verified against it, against torch.load of every file). One warm-up save is not counted.

    python tools/bench_checkpoint_manifest.py                     # the 162M save, 3 repeats
    python tools/bench_checkpoint_manifest.py --quick             # a 2-layer model, seconds
    python tools/bench_checkpoint_manifest.py --out docs/benchmarks.md --section checkpoint-manifest
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

import megatron.training.checkpoint as training_checkpoint
from benchmarks.cli import check_positive, parse_overrides, set_threads
from benchmarks.report import SECTION_NAME, environment_lines, markdown_table, replace_section
from megatron.checkpoint import manifest
from megatron.checkpoint.safe_load import allowed_globals
from megatron.cli_args import ArgumentParser
from megatron.config import load_config
from megatron.model import GPTModel
from megatron.process.distributed import init_distributed
from megatron.training.checkpoint import Checkpointer
from megatron.training.optim import build_optimizer
from megatron.training.pipeline_step import build_pipeline_engine
from megatron.training.schedule import build_scheduler

DEFAULT_CONFIGS = ["configs/paper/local_setup.yml", "configs/paper/train.yml"]
# the paper's GPT-2 tokenizer, padded (local_setup.yml); the files need not exist to build the model
FIXED = {"padded-vocab-size": 50304, "device": "cpu", "keep-last-n-checkpoints": 1}
QUICK = ["num-layers=2", "hidden-size=64", "num-attention-heads=4", "padded-vocab-size=512"]


def build(configs: list[str], overrides: dict, save_dir: str):
    """(engine, Checkpointer) of the configured model on the CPU, its optimizer state filled in."""
    cfg = load_config(configs, {**FIXED, **overrides, "save": save_dir, "run-dir": os.path.join(save_dir, "run")})
    init_distributed("cpu", cfg.parallel.distributed_backend)
    vocab = cfg.model.padded_vocab_size
    if cfg.parallel.pipe_parallel_size >= 1:
        engine, _ = build_pipeline_engine(cfg, vocab, lambda m: build_optimizer(cfg, m),
                                          lambda o: build_scheduler(cfg, o))
    else:
        # lazy: DeepSpeed picks (and logs) its accelerator on import: after init_distributed chose one
        import deepspeed

        model = GPTModel(cfg.model, vocab)
        optimizer = build_optimizer(cfg, model)
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                               lr_scheduler=build_scheduler(cfg, optimizer),
                                               config=cfg.deepspeed_config(1), dist_init_required=False)
    _fill_optimizer_state(engine.optimizer)
    return engine, Checkpointer(cfg, vocab), cfg


def _fill_optimizer_state(optimizer) -> None:
    """Adam's two moments for every parameter the innermost torch optimizer holds, as a step makes
    them (a step of the 162M model on 2 CPU cores would take minutes; the bytes saved are the same)."""
    while not isinstance(optimizer, torch.optim.Optimizer) and hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    for group in optimizer.param_groups:
        for p in group["params"]:
            optimizer.state[p] = {"step": torch.tensor(1.0), "exp_avg": torch.rand_like(p),
                                  "exp_avg_sq": torch.rand_like(p)}


def _files(tag_dir: str) -> list[str]:
    return sorted(os.path.join(r, n) for r, _, names in os.walk(tag_dir) for n in names)


def measure(engine, checkpointer, repeats: int) -> dict:
    """Median seconds of saves with and without the manifest (interleaved), and of the manifest's parts."""
    real = training_checkpoint.write_manifest
    inside: list[float] = []  # seconds spent in write_manifest during the current save

    def timed(*a, **k):
        start = time.perf_counter()
        try:
            return real(*a, **k)
        finally:
            inside.append(time.perf_counter() - start)

    times, shares = {"with": [], "without": []}, []
    checkpointer.save(engine, 0)  # warm-up, not counted: the first save of a process is the slowest
    iteration = 0
    for r in range(repeats):
        for mode in (("with", "without") if r % 2 == 0 else ("without", "with")):
            iteration += 1
            inside.clear()
            training_checkpoint.write_manifest = timed if mode == "with" else (lambda *a, **k: None)
            try:
                start = time.perf_counter()
                tag_dir = checkpointer.save(engine, iteration)
                times[mode].append(time.perf_counter() - start)
            finally:
                training_checkpoint.write_manifest = real
            if mode == "with":
                shares.append(sum(inside) / times[mode][-1])
    cfg = checkpointer.cfg
    start = time.perf_counter()  # the last step saved, as a save with the manifest writes it
    manifest.write_manifest(tag_dir, os.path.basename(tag_dir), manifest.run_layout(cfg, 1), manifest.model_keys(cfg),
                            iteration)
    write_s = time.perf_counter() - start
    files = [p for p in _files(tag_dir) if p.endswith(".pt")]
    start = time.perf_counter()
    manifest._verified.clear()
    for p in files:
        manifest.verify_file(p)
    verify_s = time.perf_counter() - start

    start = time.perf_counter()  # the read the check sits beside: weights_only with our allow-list
    with torch.serialization.safe_globals(allowed_globals(with_deepspeed=True)):
        for p in files:
            torch.load(p, map_location="cpu", weights_only=True)
    load_s = time.perf_counter() - start
    return {"times": times, "shares": shares, "write_s": write_s, "verify_s": verify_s, "load_s": load_s,
            "bytes": sum(os.path.getsize(p) for p in _files(tag_dir)), "files": len(_files(tag_dir)),
            "manifest_bytes": os.path.getsize(os.path.join(tag_dir, manifest.MANIFEST))}


def report(m: dict, params: int) -> str:
    w, wo = statistics.median(m["times"]["with"]), statistics.median(m["times"]["without"])
    rows = [
        ["save, with the manifest (median)", f"{w:.3f} s", ", ".join(f"{t:.2f}" for t in m["times"]["with"])],
        ["save, without it (median)", f"{wo:.3f} s", ", ".join(f"{t:.2f}" for t in m["times"]["without"])],
        ["ratio of the medians, with / without", f"{w / wo:.4f}",
         f"{(w / wo - 1) * 100:+.2f}%, the machine's noise included"],
        ["manifest share of each save with it (timed inside the save)",
         f"{statistics.median(m['shares']) * 100:.3f}%", ", ".join(f"{x * 100:.3f}%" for x in m["shares"])],
        ["write_manifest alone, on the saved step", f"{m['write_s'] * 1000:.1f} ms",
         f"{m['write_s'] / wo * 100:.3f}% of the median save"],
        ["step size / manifest size", f"{m['bytes'] / 2**20:,.0f} MiB", f"{m['files']} files, manifest "
                                                                        f"{m['manifest_bytes'] / 1024:.1f} KiB"],
        ["reading: verify every .pt against the manifest", f"{m['verify_s']:.3f} s",
         f"torch.load of every .pt: {m['load_s']:.3f} s"],
    ]
    return (f"{params / 1e6:.1f}M parameters\n\n"
            + markdown_table(["", "value", "detail (seconds of each save)"], rows, right={1}))


def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS, help="YAML files of the model (merged in order)")
    p.add_argument("--model-overrides", nargs="*", default=[], metavar="KEY=VALUE", help="config keys changed")
    p.add_argument("--repeats", type=int, default=3, help="saves of each kind (interleaved)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--quick", action="store_true", help="a 2-layer model: checks the tool, not the cost")
    p.add_argument("--save-dir", default=None, help="where to save (default: a temporary directory, removed)")
    p.add_argument("--out", default=None, help="markdown file to write the section into (e.g. docs/benchmarks.md)")
    p.add_argument("--section", default="checkpoint-manifest", help="section name in --out")
    args = p.parse_args(argv)
    check_positive(p, repeats=args.repeats)
    if not SECTION_NAME.match(args.section):
        p.error(f"--section {args.section!r}: lower-case letters, digits, '_' or '-'")
    set_threads(p, args.threads)
    overrides = parse_overrides(p, (QUICK if args.quick else []) + args.model_overrides)
    with contextlib.ExitStack() as stack:
        save_dir = args.save_dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="bench_manifest_"))
        save_dir = os.path.join(save_dir, "checkpoints")
        shutil.rmtree(save_dir, ignore_errors=True)
        torch.manual_seed(0)
        engine, checkpointer, cfg = build(args.configs, overrides, save_dir)
        params = sum(t.numel() for t in engine.module.parameters())
        body = report(measure(engine, checkpointer, args.repeats), params)
    print(body)
    if args.out:
        lines = environment_lines(torch.device("cpu"), "tools/bench_checkpoint_manifest.py", list(argv or sys.argv[1:]))
        replace_section(args.out, args.section, "\n".join(lines) + "\n\n" + body)
        print(f"wrote section {args.section!r} of {args.out}")
    return 0
