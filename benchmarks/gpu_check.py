"""The whole GPU check in one command, sized for one lent-GPU call (issue 32).

    sh tools/gpu_check.sh OUT_DIR            # on an H100/H200 with the device image (bundle activated)
    sh tools/gpu_check.sh OUT_DIR --tiny     # the same steps at toy sizes, on any machine (the CPU test)
    python tools/gpu_results.py OUT_DIR      # back here: fold the results into docs/benchmarks.md, docs/status.md

Steps, in the order they run (each under its own share of one clock, --seconds, default 560 s):

    test-gpu     `make test-gpu`'s pytest (tests marked gpu) over 16 workers, -v, junit XML;
                 interrupted with SIGINT at its clock so pytest still reports what finished
    attention    tools/bench_attention.py: KERPLE-log, ALiBi and KERPLE-power (a learned exponent), our
                 kernel on both bias paths (the default first), against FlexAttention ALiBi, head
                 dim 64, bf16, L = 2k-16k fwd+bwd, 32k-65k fwd
    train        tools/bench_train_step.py: the paper's Table 4 on the 162M model (7 schemes), plus
                 one 65,536-token evaluation forward, and where the step's time goes (--profile:
                 kernel categories and device idle time for kerple_log, alibi and none)
    train-ops-gpu  tools/bench_train_step.py --count-ops: the kernel launches and host syncs of one
                 162M training step (kerple_log, alibi, none; 2, 4 and 12 layers), the real kernels:
                 what KERPLE adds outside attention, counted on the device it costs on (seconds)
    train-ops-pipe-gpu  the same through DeepSpeed's pipeline engine (deepy.py's path for the paper's
                 config, --count-path pipe), into the same file
    throughput   the paper's config through deepy.py (DeepSpeed, bf16, activation checkpointing) on
                 random tokens: tokens/s and MFU as train.py logs them
    attention-hd128  the attention step at head dim 128, with what time is left
    retrieval    only with --only retrieval (a call of its own, ~5 minutes): tools/extrapolation_study.py,
                 the quickstart model trained on the retrieval corpus per scheme (kerple_log, alibi,
                 rotary, none; 3000 steps of 64 x 128 tokens) and the kv grid at 1x-64x with window
                 attention beside them, into retrieval.md (issue 53: a CPU does not teach the copy);
                 gpu_check.log keeps each grid length's time (issue 58: the grid at 16x-64x)
    document-mask  only with --only document-mask (~1 minute, fits beside retrieval): packed documents
                 (~64 and ~16 tokens) against the unmasked step of the quickstart model, triton, flex and sdpa,
                 bf16, 4,096 tokens (issue 56's GPU figure), into document-mask.md
    position-recipes  only with --only position-recipes (a call of its own): the same for kerple_log,
                 rotary and none, each plain, with randomized positions and with PoSE (issue 56),
                 1500 steps each, into position-recipes.md

A step starts only when the clock leaves it its minimum; otherwise it is skipped with a line that
says so. The benchmark steps get a --time-budget of their own (they skip their last cells, the
baselines run first), and every step has a hard timeout. OUT_DIR receives at most 8 files (the
device tool returns no more): summary.json (per step: status, exit code, seconds; the device),
gpu_check.log (every step's output), test-gpu.xml, attention.md, attention-hd128.md, train.md,
train-ops-gpu.md and throughput.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from megatron.atomic_io import atomic_output
from megatron.cli_args import ArgumentParser
from megatron.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SUMMARY = "summary.json"
INTERRUPT_GRACE = 20.0  # seconds between SIGINT and SIGKILL: pytest writes its report in this time
LOG = "gpu_check.log"


@dataclass
class Step:
    name: str
    minimum: float  # seconds the clock must still hold for the step to start
    cap: float  # its hard timeout (a benchmark's own --time-budget is set below this)
    argv: list[str]
    outputs: list[str] = field(default_factory=list)  # files it writes under OUT_DIR
    interrupt: bool = False  # at its timeout: SIGINT first (pytest then reports what finished), SIGKILL later
    on_request: bool = False  # only when --only names it: its own call (it does not fit beside the others)


def bench_attention(out: str, name: str, head_dim: int, tiny: bool, budget: float,
                    extra_schemes: tuple[str, ...] = ()) -> list[str]:
    # The reference backend is skipped: a CPU correctness baseline, minutes at long lengths on a
    # GPU (it ran out of memory at 32k on the H200). Cells run in bench_attention's priority: the
    # baselines, our kernel on the library's bias path, the other path, then flex.
    argv = ["tools/bench_attention.py", "--schemes", "kerple_log", "alibi", *extra_schemes, "--head-dim",
            str(head_dim), "--time-budget", f"{budget:.0f}", "--out", os.path.join(out, f"{name}.md"),
            "--section", name, "--skip-backends", "reference"]
    if tiny:
        return argv + ["--quick", "--backends", "sdpa", "--lengths", "64", "--fwd-only-lengths", "128",
                       "--tokens", "256", "--heads", "2"]
    return argv + ["--backends", "triton", "flex", "--triton-bias", "both", "--lengths", "2048", "4096", "8192",
                   "16384", "--fwd-only-lengths", "32768", "65536"]


def steps(out: str, tiny: bool, python: str) -> list[Step]:
    s = 0.1 if tiny else 1.0  # minimums and caps shrink with the toy sizes
    test_argv = ["-m", "pytest", "-q", "-m", "gpu", "--junitxml", os.path.join(out, "test-gpu.xml"),
                 "-o", "junit_logging=system-out", "-p", "no:cacheprovider"]
    if tiny:
        test_argv += ["tests/gpu"]  # on CPU every test there skips: the plumbing, in seconds
    else:
        # -v: each result is a line as it happens ("[gw3] PASSED tests/...::name"), so a log cut short
        # still names every failure; --timeout: one hung test cannot hold the whole step; worksteal:
        # an idle worker takes queued tests from a busy one (the slowest, fp32 kernels at real sizes,
        # come last in collection order).
        test_argv += ["-n", "16", "--dist", "worksteal", "-v", "-rfE", "--timeout", "90", "--durations", "20",
                      "-p", "no:benchmark", "tests"]
    train = ["tools/bench_train_step.py", "--out", os.path.join(out, "train.md"), "--section", "train"]
    train += ["--quick", "--schemes", "kerple_log", "alibi", "none", "--time-budget", "60", "--profile", "kerple_log",
              "none"] if tiny \
        else ["--eval-length", "65536", "--time-budget", "65", "--profile", "kerple_log", "alibi", "none"]
    train_ops = ["tools/bench_train_step.py", "--count-ops", "--schemes", "kerple_log", "alibi", "none", "--out",
                 os.path.join(out, "train-ops-gpu.md")]  # both counts' sections in one file (8 files come back)
    if tiny:
        train_ops += ["--quick", "--count-layers", "1", "2"]

    def study(name: str, argv: list[str]) -> list[str]:
        return [python, "tools/extrapolation_study.py", "--out", os.path.join(tempfile.gettempdir(), f"gpu_check_{name}"),
                "--table", os.path.join(out, f"{name}.md"), *argv, *(["--tiny"] if tiny else [])]

    # test-gpu first: on 2026-11-27 (H200) it needed more than 265 s with 16 workers, so it gets the
    # largest share; when its clock runs out it is interrupted (SIGINT), and pytest still writes the
    # junit XML and the failures' summary for the tests that finished.
    return [
        Step("test-gpu", 90 * s, 240, [python, *test_argv], ["test-gpu.xml"], interrupt=True),
        # kerple_power_ap_ here: auto's inline choice for a learned exponent is inferred, not yet timed
        Step("attention", 60 * s, 130, [python, *bench_attention(out, "attention", 64, tiny, 110,
                                                                 ("kerple_power_ap_",))], ["attention.md"]),
        Step("train", 50 * s, 100, [python, *train], ["train.md"]),
        Step("train-ops-gpu", 20 * s, 60, [python, *train_ops, "--section", "train-ops-gpu"], ["train-ops-gpu.md"]),
        Step("train-ops-pipe-gpu", 20 * s, 60, [python, *train_ops, "--count-path", "pipe", "--section",
                                                 "train-ops-pipe-gpu"], ["train-ops-gpu.md"]),
        Step("throughput", 50 * s, 70, [python, "tools/gpu_throughput.py", "--out",
                                        os.path.join(out, "throughput.json"), *(["--tiny"] if tiny else [])],
             ["throughput.json"]),
        Step("attention-hd128", 45 * s, 0, [python, *bench_attention(out, "attention-hd128", 128, tiny, 0)],
             ["attention-hd128.md"]),
        Step("document-mask", 20 * s, 120, [python, "tools/bench_document_mask.py", "--device", "cuda", "--dtype",
                                            "bfloat16", "--backend", "triton", "flex", "sdpa", "--seq-length", "4096",
                                            "--reps", "10", "--out", os.path.join(out, "document-mask.md")]
             if not tiny else [python, "tools/bench_document_mask.py", "--reps", "1", "--out",
                               os.path.join(out, "document-mask.md")], ["document-mask.md"], on_request=True),
        # Their runs (checkpoints) go outside OUT_DIR, which comes back whole; only the tables come back.
        Step("retrieval", 60 * s, 0, study("retrieval", ["--schemes", "kerple_log", "alibi", "rotary", "none",
                                                                     *([] if tiny else ["--max-factor", "64"])]),
             ["retrieval.md"], on_request=True),
        Step("position-recipes", 60 * s, 0, study("position-recipes", [
            "--schemes", "kerple_log", "rotary", "none", "--recipes", "plain", "randomized", "pose", "--backend",
            "sdpa", "--train-iters", "1500"]), ["position-recipes.md"], on_request=True),
    ]


def device_info(python: str) -> dict:
    code = ("import json, torch; c = torch.cuda.is_available(); print(json.dumps({'torch': torch.__version__, "
            "'cuda': torch.version.cuda, 'gpu': torch.cuda.get_device_name(0) if c else None, "
            "'gpu_memory_gib': round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1) if c else None}))")
    try:
        proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
        info = json.loads(proc.stdout.strip().splitlines()[-1])
    except Exception as e:  # the summary still says what went wrong
        info = {"error": f"{type(e).__name__}: {e}"}
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.sm",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        info["nvidia_smi"] = smi.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        info["nvidia_smi"] = None
    return info


def run_step(step: Step, seconds: float, log) -> dict:
    """Run one step under `seconds`; its output goes to the log as it comes."""
    log.write(f"\n===== {step.name}: {shlex.join(step.argv)} (timeout {seconds:.0f} s)\n")
    log.flush()
    t0 = time.monotonic()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(step.argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    grace = INTERRUPT_GRACE if step.interrupt else 0.0
    try:
        rc = proc.wait(timeout=max(seconds - grace, 1.0))
        status = "ok" if rc == 0 else "failed"
    except subprocess.TimeoutExpired:
        rc = None
        if step.interrupt:
            os.killpg(proc.pid, signal.SIGINT)  # the whole group: pytest and its xdist workers
            try:
                rc = proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        if rc is None:
            os.killpg(proc.pid, signal.SIGKILL)  # its children (pytest workers, deepy's ranks) too
            proc.wait()
        status = "timed out"
    took = time.monotonic() - t0
    log.write(f"===== {step.name}: {status} (rc {rc}) in {took:.0f} s\n")
    log.flush()
    return {"name": step.name, "status": status, "rc": rc, "seconds": round(took, 1), "timeout": round(seconds),
            "command": shlex.join(step.argv)}


def run(out: str, total: float, tiny: bool, python: str, only: list[str] | None = None) -> dict:
    os.makedirs(out, exist_ok=True)
    start = time.monotonic()
    summary = {"format": "kerple-gpu-check/1", "tiny": tiny, "seconds_budget": total,
               "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "steps": []}
    summary["device"] = device_info(python)
    plan = [st for st in steps(out, tiny, python) if (st.name in only if only else not st.on_request)]
    with open(os.path.join(out, LOG), "a") as log:
        log.write(f"gpu_check {summary['date']}: device {json.dumps(summary['device'])}\n")
        for i, step in enumerate(plan):
            left = total - (time.monotonic() - start)
            if left < step.minimum:
                line = f"skipped: {left:.0f} s left of {total:.0f}, the step needs at least {step.minimum:.0f}"
                log.write(f"\n===== {step.name}: {line}\n")
                summary["steps"].append({"name": step.name, "status": "skipped", "why": line})
                print(f"[gpu_check] {step.name}: {line}", flush=True)
                continue
            # Leave the later steps their minimums; a cap of 0 means "all that is left".
            later = sum(st.minimum for st in plan[i + 1:])
            seconds = left - later if step.cap == 0 else min(step.cap, max(left - later, step.minimum))
            if step.cap == 0 and "--time-budget" in step.argv:  # the last benchmark: its budget follows the clock
                k = step.argv.index("--time-budget")
                step.argv[k + 1] = f"{max(seconds - (5 if tiny else 30), 1):.0f}"
            print(f"[gpu_check] {step.name}: starting, {seconds:.0f} s at most ({left:.0f} s left)", flush=True)
            result = run_step(step, seconds, log)
            result["outputs"] = [f for f in step.outputs if os.path.exists(os.path.join(out, f))]
            summary["steps"].append(result)
            print(f"[gpu_check] {step.name}: {result['status']} in {result['seconds']:.0f} s", flush=True)
            write_summary(out, summary)  # a call cut short still returns every finished step
    summary["seconds"] = round(time.monotonic() - start, 1)
    write_summary(out, summary)
    return summary


def write_summary(out: str, summary: dict) -> None:
    with atomic_output(os.path.join(out, SUMMARY), fsync=False) as tmp, open(tmp, "w") as f:
        json.dump(summary, f, indent=1)


def main() -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="directory for the results (created); on the device tool: $OUT")
    p.add_argument("--tiny", action="store_true", help="toy sizes on any machine: checks the plumbing, no GPU needed")
    p.add_argument("--seconds", type=float, default=None, help="the clock for all steps (default 560; --tiny 120)")
    p.add_argument("--only", nargs="+", default=None, metavar="STEP", help="run just these steps (a re-run)")
    args = p.parse_args()
    total = args.seconds if args.seconds is not None else 120.0 if args.tiny else 560.0
    if total <= 0:
        p.error(f"--seconds must be > 0, got {total}")
    names = [st.name for st in steps(args.out, args.tiny, sys.executable)]
    if args.only:
        unknown = [n for n in args.only if n not in names]
        if unknown:
            p.error(f"unknown step(s) {', '.join(unknown)}; choose from: {', '.join(names)}")
    if os.path.isfile(args.out):
        raise UserError(f"{args.out} is a file; give a directory for the results")
    summary = run(args.out, total, args.tiny, sys.executable, args.only)
    bad = [s["name"] for s in summary["steps"] if s["status"] != "ok"]
    print(f"[gpu_check] done in {summary['seconds']:.0f} s; "
          + (f"not ok: {', '.join(bad)}" if bad else "every step ok") + f"; results in {args.out}")
    return 0
