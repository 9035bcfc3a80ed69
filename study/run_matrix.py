"""Run an experiment matrix (from tools/make_experiments.py) locally, one run after another.

Resumable: a run whose evaluation file exists is skipped, and an interrupted training resumes
from its checkpoint (each experiment sets load = save). Run it in parts or in the background:

    python tools/run_matrix.py configs/experiments/repro_cpu/matrix.json \\
        --eval-args "--max-factor 32 --max-tokens 65536 --batch-size 4" --windowed 128
    python tools/run_matrix.py MATRIX --index 3          # one run (what the slurm array job does)
    python tools/run_matrix.py MATRIX --records docs/results/runs ...
    python tools/run_matrix.py MATRIX --shard 1/2 & python tools/run_matrix.py MATRIX --shard 2/2  # two cores

With --records DIR, each finished run is also reduced to DIR/<run name>/ (evaluations, training
trajectory with each head's positional parameters, learned kernel: study/run_record.py)
and a run whose record is complete is skipped: commit DIR and the matrix continues on a fresh
clone or another machine, without the checkpoints.
"""
import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time

from megatron.cli_args import ArgumentParser
from megatron.config.errors import did_you_mean
from megatron.errors import UserError
from megatron.launch.signals import run_child
from megatron.process.metrics_file import metrics_path
from study.experiments import read_matrix

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd: list[str], log_path: str) -> None:
    with open(log_path, "a") as log:
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        rc, stopped_by = run_child(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    if stopped_by is not None:
        stop = UserError(f"stopped by {signal.Signals(stopped_by).name}: {' '.join(cmd)} exited {rc} after it "
                         f"(a training run saves first); its output is in {log_path}; run the same command "
                         "again to resume the matrix")
        stop.exit_code = 128 + stopped_by  # as a process the signal ended
        raise stop
    if rc != 0:
        raise UserError(f"command failed (exit {rc}): {' '.join(cmd)}; its output is in {log_path}")


def window_size(windowed: str | None, full_eval: str) -> int | None:
    """--windowed's W: a number, or "L" = the run's own train length (read from its full evaluation)."""
    if not windowed:
        return None
    if windowed == "L":
        with open(full_eval) as f:
            return int(json.load(f)["train_length"])
    try:
        return int(windowed)
    except ValueError:
        raise UserError(f"--windowed {windowed!r}: give a window size or L (each run's train length)") from None


def run_one(base: list[str], r, eval_args: list[str], windowed: str | None, records: str | None = None) -> str:
    """Train (resuming), evaluate, optionally evaluate windowed and write the run's record; each
    step skipped when done."""
    from study.run_record import record_complete, write_record  # lazy: torch, after the CLI is parsed

    record = os.path.join(records, r.name) if records else None
    if record and record_complete(record):
        return "skipped (record complete)"
    full = os.path.join(r.run_dir, "eval")
    window = os.path.join(r.run_dir, "eval_window")
    todo_full = not os.path.isfile(os.path.join(full, "eval.json"))
    todo_window = bool(windowed) and not os.path.isfile(os.path.join(window, "eval.json"))
    if not (todo_full or todo_window or record):
        return "skipped (done)"
    os.makedirs(r.run_dir, exist_ok=True)
    log = os.path.join(r.run_dir, "matrix.log")
    start = time.time()
    evaluate = [sys.executable, "evaluate.py", "--checkpoint", r.checkpoints, "--dataset", r.dataset, "--quiet"]
    if todo_full:
        run([sys.executable, "deepy.py", "train.py", *base, r.config], log)
        run(evaluate + eval_args + ["--out", full], log)
    if todo_window:
        run(evaluate + eval_args + ["--window", str(window_size(windowed, os.path.join(full, "eval.json"))),
                                    "--out", window], log)
    seconds = time.time() - start
    if record:
        with open(os.path.join(full, "eval.json")) as f:  # the kernel is recorded out to the longest length
            longest = max(int(x["length"]) for x in json.load(f)["results"])
        write_record(record, r, full, window if windowed else None, metrics_path(r.run_dir), longest, seconds)
    return f"done in {seconds:.0f}s"


def parse_shard(text: str) -> tuple[int, int]:
    """--shard K/N -> (K, N), 1 <= K <= N: this process takes every N-th run from the K-th on, so N
    processes share one matrix without two of them training the same run."""
    k, sep, n = text.partition("/")
    try:
        k, n = int(k), int(n)
    except ValueError:
        k = n = 0
    if not sep or not 1 <= k <= n:
        raise UserError(f"--shard {text!r}: give K/N with 1 <= K <= N, e.g. 1/2 and 2/2 for two processes")
    return k, n


def listing(runs) -> str:
    names = [r.name for r in runs]
    return f"{len(runs)} run{'s' if len(runs) != 1 else ''}: " + ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")


def select_runs(runs, matrix: str, index: int | None, only: str | None, shard: tuple[int, int] | None) -> list:
    """The runs --index, --only and --shard leave; a selection that leaves none is refused, naming
    what it was applied to (a typo in --only used to run nothing, say nothing and exit 0)."""
    if not runs:
        raise UserError(f"matrix {matrix} lists no run: nothing to run; write it with tools/make_experiments.py")
    where = matrix
    if index is not None:
        if not 0 <= index < len(runs):
            raise UserError(f"--index {index} out of range: the matrix has {len(runs)} runs (0-{len(runs) - 1})")
        runs, where = [runs[index]], f"{matrix} selected by --index {index}"
    if only:
        matched = [r for r in runs if only in r.name]
        if not matched:
            words = dict.fromkeys([r.name for r in runs] + [w for r in runs for w in (r.scheme, r.label, r.dataset) if w])
            raise UserError(f"--only {only!r} matches no run of {where} ({listing(runs)}){did_you_mean(only, words)}; "
                            "nothing was run: --only keeps the runs whose name contains its text")
        runs, where = matched, f"{where} with --only {only!r}"
    if shard:
        k, n = shard
        if k > len(runs):
            raise UserError(f"--shard {k}/{n} leaves no run: {where} has {listing(runs)}, so shards past {len(runs)} "
                            f"are empty; use N <= {len(runs)}; nothing was run")
        runs = runs[k - 1::n]
    return runs


def check_windowed_only(windowed: str | None, scheme: str | None, runs, matrix: str) -> None:
    """--windowed-only must name a scheme of the matrix (a typo skipped every windowed evaluation)."""
    if scheme is None:
        return
    if not windowed:
        raise UserError(f"--windowed-only {scheme} applies to --windowed W, which is not given: nothing would be "
                        "evaluated windowed; add --windowed W (or L), or drop --windowed-only")
    schemes = list(dict.fromkeys(r.scheme for r in runs))
    if scheme not in schemes:
        raise UserError(f"--windowed-only {scheme!r} is no scheme of {matrix} ({', '.join(schemes)})"
                        f"{did_you_mean(scheme, schemes)}; no run would be evaluated windowed")


def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("matrix", help="matrix.json written by tools/make_experiments.py")
    p.add_argument("--eval-args", default="", help="extra evaluate.py arguments, quoted")
    p.add_argument("--windowed", default=None,
                   help="also evaluate with attention window W (a number, or L: each run's own train length)")
    p.add_argument("--windowed-only", default=None,
                   help="with --windowed: only for runs whose scheme is this (e.g. kerple_log, the paper's Fig. 5)")
    p.add_argument("--index", type=int, default=None, help="run only this entry (0-based)")
    p.add_argument("--only", default=None, help="run only entries whose name contains this text")
    p.add_argument("--shard", default=None, metavar="K/N",
                   help="run only the K-th of every N runs (N processes, one per core, share the matrix)")
    p.add_argument("--records", default=None, metavar="DIR",
                   help="write each finished run's record to DIR/<run name>/ and skip runs whose record is complete")
    args = p.parse_args(argv)
    shard = parse_shard(args.shard) if args.shard else None
    base, runs = read_matrix(args.matrix)
    check_windowed_only(args.windowed, args.windowed_only, runs, args.matrix)
    runs = select_runs(runs, args.matrix, args.index, args.only, shard)
    where = f", shard {shard[0]}/{shard[1]}" if shard else ""
    for i, r in enumerate(runs):
        windowed = args.windowed if (not args.windowed_only or r.scheme == args.windowed_only) else None
        result = run_one(base, r, shlex.split(args.eval_args), windowed, args.records)
        # One whole line per run, written when it ends: shards share a log without splitting lines
        # (a run in progress writes to its own run_dir/matrix.log).
        print(f"[{i + 1}/{len(runs)}{where}] {r.name}: {result}", flush=True)
    return 0
