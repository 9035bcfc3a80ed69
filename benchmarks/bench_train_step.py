"""Training-step speed per positional scheme on our stack: the KERPLE paper's Table 4.

For each scheme, the model is built from the YAML configs (default: the paper's 162M GPT,
configs/paper/local_setup.yml + train.yml) with pos-emb set to the scheme, and N optimizer steps
are timed on random tokens: forward, backward, gradient clipping (the config's value) and the
project's AdamW (megatron/training/optim.py). No DeepSpeed and no data pipeline, so the figure is
the model's own cost. The table gives sec/step (median), tokens/s, peak GPU memory, the attention
backend "auto" chose (GPTModel.backend, read back from the trained model) and the overhead over
`none` (no positional information) measured in the same process, then the paper's Table 4
ratios (KERPLE-log against ALiBi, `none`, sinusoidal, ...) beside the paper's own and issue 22's goals.

Precision: `autocast` (bf16 autocast over fp32 weights, the CUDA default), `bf16` (weights cast
to bf16, as DeepSpeed's bf16 mode does) or `fp32` (the CPU default). Note that under autocast
the model resolves its backend for the embedding dtype (fp32), the column shows what it chose.

    python tools/bench_train_step.py --quick                                   # CPU smoke, < 1 min
    python tools/bench_train_step.py --out docs/benchmarks.md --section train   # on a GPU
    python tools/bench_train_step.py --schemes kerple_log none --model-overrides num-layers=2 hidden-size=128

--count-ops counts instead of timing (benchmarks/step_ops.py): the operations one step dispatches
outside the attention kernels (each a kernel launch on a GPU), the attention kernels' launches and
the host syncs, per scheme and at each of --count-layers depths, on the backend `auto` takes on
CUDA. On a CPU the Triton kernels are counted stand-ins (they launch nothing), so the count is the
GPU's; on a GPU the real step is counted:

    python tools/bench_train_step.py --count-ops --schemes kerple_log alibi none --device cpu \
        --seq-length 64 --micro-batch 1 --count-layers 2 4 12 --out docs/benchmarks.md

--count-path pipe counts deepy.py's path for pipe-parallel-size >= 1 (the paper's config) instead:
one train_batch of DeepSpeed's pipeline engine around GPTPipe (one stage), with the config's
DeepSpeed precision (bf16 for the paper's: DeepSpeed's bf16 optimizer, its gradient clipping).
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import sys
from collections import Counter
from dataclasses import dataclass, field

import torch

from benchmarks.budget import TimeBudget
from benchmarks.cli import check_names, check_positive, parse_overrides, pick_device, set_threads
from benchmarks.profile import kernel_times, profile_tables
from benchmarks.report import SECTION_NAME, environment_lines, mark_partial, markdown_table, replace_section
from benchmarks.step_ops import count_step, use_foreach
from benchmarks.timing import (
    error_cell,
    median_seconds,
    peak_memory_gib,
    release_memory,
    reset_peak_memory,
)
from megatron.attention import backend_names, resolve_backend
from megatron.cli_args import ArgumentParser
from megatron.config import ConfigError, load_config
from megatron.launch.launcher import KNOWN_VOCAB
from megatron.model import GPTModel, count_parameters
from megatron.positional.base import positional_spec
from megatron.positional.registry import build_scheme, scheme_names
from megatron.process.distributed import init_distributed
from megatron.tokenizer import padded_vocab_size
from megatron.training.optim import build_optimizer
from megatron.training.pipeline_step import build_pipeline_engine
from megatron.training.schedule import build_scheduler

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DEFAULT_CONFIGS = ["configs/paper/local_setup.yml", "configs/paper/train.yml"]
DEFAULT_SCHEMES = ["kerple_log", "kerple_power_ap_", "alibi", "rpe", "rotary", "sinusoidal", "none"]
DEFAULTS = {"steps": 20, "warmup": 5, "model_overrides": []}
# A model small enough for 7 schemes x a few steps on 2 CPU cores in well under a minute.
QUICK = {"steps": 5, "warmup": 2, "micro_batch": 4, "seq_length": 128, "threads": 1,
         "model_overrides": ["num-layers=2", "hidden-size=64", "num-attention-heads=4", "padded-vocab-size=512"]}
PRECISIONS = ("autocast", "bf16", "fp32")
COUNT_PATHS = ("model", "pipe")
# The paper's Table 4 (arXiv 2205.09921): sec/step of its 162M model on one A100-40GB, unfused
# attention with the bias materialised. It has no `none` row.
PAPER_SEC_PER_STEP = {"kerple_log": 0.307, "kerple_power_ap_": 0.321, "alibi": 0.302, "rpe": 0.340,
                      "rotary": 0.332, "sinusoidal": 0.298}
# (numerator, denominator, goal as the largest ratio - 1 allowed, or None): KERPLE-log against
# each reference scheme, in the order the paper's text quotes them; goals from issue 22.
RATIOS = [("kerple_log", "alibi", 0.02), ("kerple_log", "none", 0.05), ("kerple_log", "sinusoidal", None),
          ("kerple_log", "rotary", None), ("kerple_log", "rpe", None), ("kerple_log", "kerple_power_ap_", None)]


@dataclass
class Result:
    scheme: str
    backend: str = "-"
    params: int | None = None
    sec_per_step: float | None = None
    tokens_per_s: float | None = None
    peak_gib: float | None = None
    overhead_pct: float | None = None
    cell: str = "-"  # the sec/step cell when not measured: 'OOM', 'error' or 'refused' (why: in notes)
    eval_s: float | None = None  # --eval-length: one no-grad forward + losses of one sequence
    eval_peak_gib: float | None = None
    eval_cell: str = "-"
    notes: list[str] = field(default_factory=list)
    profile: dict[str, float] | None = None  # --profile: seconds per step by kernel name


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS, help="YAML files merged in order (later wins)")
    p.add_argument("--schemes", nargs="+", default=DEFAULT_SCHEMES, help="pos-emb names; include none for the overhead")
    p.add_argument("--model-overrides", nargs="*", default=None, metavar="KEY=VALUE",
                   help="config keys set after the files, e.g. num-layers=2 hidden-size=128")
    p.add_argument("--micro-batch", type=int, default=None, help="sequences per step (default: the config's)")
    p.add_argument("--seq-length", type=int, default=None, help="tokens per sequence (default: the config's)")
    p.add_argument("--steps", type=int, default=None, help=f"timed steps, median kept (default {DEFAULTS['steps']})")
    p.add_argument("--warmup", type=int, default=None, help=f"untimed steps first (default {DEFAULTS['warmup']})")
    p.add_argument("--eval-length", type=int, default=None,
                   help="also time one evaluation forward (no grad, batch 1) of this many tokens per scheme "
                        "and its peak memory, e.g. 65536 (the optimizer state is dropped first)")
    p.add_argument("--attention-backend", default="auto", help="auto, or force one backend for every scheme")
    p.add_argument("--precision", choices=PRECISIONS, default=None, help="default autocast on CUDA, fp32 on CPU")
    p.add_argument("--activation-checkpointing", choices=("config", "on", "off"), default="config",
                   help="recompute activations in backward (default: the config's checkpoint-activations)")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu or cuda[:N]")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's own; --quick: 1, steadier on a shared machine)")
    p.add_argument("--quick", action="store_true",
                   help=f"CPU smoke test: {QUICK} in fp32 on CPU (explicit options still win)")
    p.add_argument("--count-ops", action="store_true",
                   help="count the operations of one step (kernel launches outside attention, attention kernels, "
                        "host syncs) per scheme instead of timing; on a CPU the Triton kernels are stand-ins")
    p.add_argument("--count-layers", nargs="+", type=int, default=None, metavar="N",
                   help="--count-ops: the depths to count at (default 2, 4 and the config's num-layers)")
    p.add_argument("--count-path", choices=COUNT_PATHS, default="model",
                   help="--count-ops: model (GPTModel, the project's AdamW, --precision) or pipe (deepy.py's path "
                        "for pipe-parallel-size 1: DeepSpeed's pipeline engine around GPTPipe, the config's "
                        "DeepSpeed precision)")
    p.add_argument("--out", default=None, help="markdown file whose section to rewrite (e.g. docs/benchmarks.md)")
    p.add_argument("--section", default=None, help="section name in --out (default train; train-ops with --count-ops)")
    p.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="start no scheme after this many seconds; the rest are marked 'skipped: out of time' "
                        "(`none` and alibi run right after the first scheme, so the ratios survive)")
    p.add_argument("--profile", nargs="+", default=[], metavar="SCHEME",
                   help="also profile 3 steps of these schemes (torch.profiler) and add a table of where "
                        "the step's time goes by kernel category, e.g. --profile kerple_log alibi none")
    args = p.parse_args(argv)

    if args.count_path == "pipe" and not args.count_ops:
        p.error("--count-path goes with --count-ops")
    if args.count_path == "pipe" and args.precision is not None:
        p.error("--count-path pipe runs the config's DeepSpeed precision (fp16/bf16 sections); drop --precision")
    base = {**DEFAULTS, **QUICK} if args.quick else DEFAULTS
    for key, value in base.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    set_threads(p, args.threads)
    args.device = pick_device(p, "cpu" if args.quick and args.device == "auto" else args.device)
    if args.precision is None:
        args.precision = "autocast" if args.device.type == "cuda" else "fp32"
    check_positive(p, steps=args.steps, micro_batch=args.micro_batch, seq_length=args.seq_length,
                   eval_length=args.eval_length)
    if args.warmup < 0:
        p.error(f"--warmup must be >= 0, got {args.warmup}")
    if args.time_budget is not None and args.time_budget <= 0:
        p.error(f"--time-budget must be > 0 seconds, got {args.time_budget}")
    check_names(p, args.schemes, scheme_names(), "positional scheme")
    if set(args.profile) - set(args.schemes):
        p.error(f"--profile {' '.join(args.profile)}: profile only schemes measured in this run "
                f"(--schemes {' '.join(args.schemes)})")
    if args.attention_backend != "auto":
        check_names(p, [args.attention_backend], ["auto", *backend_names()], "attention backend")
    missing = [c for c in args.configs if not os.path.isfile(os.path.join(ROOT, c)) and not os.path.isfile(c)]
    if missing:
        p.error(f"config file(s) not found: {', '.join(missing)}")
    if args.section is None:
        args.section = "train-ops" if args.count_ops else "train"
    if args.count_layers is not None and not args.count_ops:
        p.error("--count-layers goes with --count-ops")
    check_positive(p, count_layers=args.count_layers)
    if not SECTION_NAME.match(args.section):
        p.error(f"--section {args.section!r}: use lower-case letters, digits, '_' or '-'")
    args.overrides = parse_overrides(p, args.model_overrides)
    args.argv = list(argv)
    args.budget = TimeBudget(args.time_budget)
    args.cfg = load(p, args, args.schemes[0])  # fail now, with the config's own message, not per scheme
    if args.count_ops and args.count_layers is None:
        args.count_layers = [2, 4, args.cfg.model.num_layers]
    if args.count_ops:
        args.count_layers = sorted(set(args.count_layers))
    return args


def load(parser, args, scheme: str, extra: dict | None = None):
    """The merged config for one scheme (`extra`: keys set last); a bad file or override exits 2
    with every problem listed."""
    over = dict(args.overrides)
    over["pos-emb"] = scheme
    over["attention-backend"] = args.attention_backend
    over.update(extra or {})
    if args.seq_length is not None:
        over["seq-length"] = args.seq_length
        over.setdefault("max-position-embeddings", args.seq_length)  # learned/sinusoidal tables
    if args.micro_batch is not None:
        over["train_micro_batch_size_per_gpu"] = args.micro_batch
    paths = [c if os.path.isfile(c) else os.path.join(ROOT, c) for c in args.configs]
    try:
        return load_config(paths, overrides=over)
    except ConfigError as e:
        if parser is None:
            raise
        parser.error(f"invalid configuration:\n{e}")


def vocab_size(cfg) -> int:
    """The padded vocab without reading a vocab file (random tokens need no tokenizer)."""
    m = cfg.model
    if m.padded_vocab_size:
        return m.padded_vocab_size
    raw = KNOWN_VOCAB.get(cfg.data.tokenizer_type)
    if raw is None:
        raise ValueError(f"tokenizer {cfg.data.tokenizer_type!r} has no known size; set padded-vocab-size "
                         "with --model-overrides")
    return padded_vocab_size(raw, m.make_vocab_size_divisible_by, cfg.parallel.model_parallel_size)


def shape(args, cfg) -> tuple[int, int]:
    micro = cfg.training.train_micro_batch_size_per_gpu
    if micro is None:
        raise ValueError("the config sets no train_micro_batch_size_per_gpu; pass --micro-batch")
    return micro, cfg.model.seq_length


def checkpointing(args, cfg) -> bool:
    return {"config": cfg.training.checkpoint_activations, "on": True, "off": False}[args.activation_checkpointing]


def failed(res: Result, exc: Exception, what: str) -> str:
    """'OOM' or 'error' for the cell; an error's text goes to the row's note."""
    text = error_cell(exc)
    if text != "OOM":
        res.notes.append(f"{what} {text}" if what else text)
    return "OOM" if text == "OOM" else "error"


def build(args, cfg):
    """(model, vocab size) for one config, on the run's device and precision, in training mode."""
    torch.manual_seed(0)
    vocab = vocab_size(cfg)
    model = GPTModel(cfg.model, vocab, checkpoint_activations=checkpointing(args, cfg)).to(args.device)
    if args.precision == "bf16":
        model = model.to(torch.bfloat16)
    return model.train(), vocab


def autocast_context(args):
    """A context factory: bf16 autocast for --precision autocast, else nothing."""
    return (lambda: torch.autocast(args.device.type, dtype=torch.bfloat16)) if args.precision == "autocast" \
        else contextlib.nullcontext


def train_step(args, cfg, model, vocab: int, losses: list):
    """(optimizer, step): step() is one optimizer step on random tokens, its loss appended to `losses`."""
    dev = args.device
    micro, seq = shape(args, cfg)
    optimizer = build_optimizer(cfg, model)
    clip = cfg.optimizer.gradient_clipping
    data = torch.randint(0, vocab, (micro, seq + 1), device=dev)
    tokens, labels = data[:, :-1], data[:, 1:]
    autocast = autocast_context(args)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            loss = model(tokens, labels=labels)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        losses.append(loss.detach())

    return optimizer, step


def measure(args, scheme: str) -> Result:
    res = Result(scheme)
    cfg = load(None, args, scheme)
    dev = args.device
    micro, seq = shape(args, cfg)
    model, vocab = build(args, cfg)
    res.params = count_parameters(model)
    try:  # the backend the model resolves for itself: hidden_states asks with the embedding's dtype
        res.backend = model.backend(dev, model.word_embeddings.weight.dtype).name
    except ValueError as e:  # an explicit --attention-backend that cannot run this scheme here
        res.backend, res.cell = args.attention_backend, "refused"
        res.notes.append(" ".join(str(e).split()))
        return res
    losses = []
    optimizer, step = train_step(args, cfg, model, vocab, losses)
    autocast = autocast_context(args)

    try:
        reset_peak_memory(dev)
        res.sec_per_step = median_seconds(step, dev, args.warmup, args.steps)
        res.peak_gib = peak_memory_gib(dev)
        res.tokens_per_s = micro * seq / res.sec_per_step
        if not all(torch.isfinite(torch.stack(losses))):
            res.notes.append("non-finite loss")
    except Exception as e:  # still try the evaluation below
        res.cell = failed(res, e, "train:" if args.eval_length else "")
    if scheme in args.profile and res.sec_per_step is not None:
        try:
            res.profile = kernel_times(step, dev)
        except Exception as e:  # the profile is extra: its failure must not cost the table
            res.notes.append(f"profile failed: {type(e).__name__}: {' '.join(str(e).split())[:200]}")
    if args.eval_length:
        # What an evaluation process holds: weights, no gradients, no optimizer state.
        optimizer.state.clear()
        model.zero_grad(set_to_none=True)
        release_memory(dev)
        measure_eval(args, model, vocab, autocast, res)
    return res


def measure_eval(args, model, vocab: int, autocast, res: Result) -> None:
    """One batch-1 evaluation forward at --eval-length (logits in chunks, as evaluate.py does)."""
    dev = args.device
    data = torch.randint(0, vocab, (1, args.eval_length + 1), device=dev)
    model.eval()

    def forward():
        with torch.no_grad(), autocast():
            model.token_losses(data[:, :-1], data[:, 1:])

    try:
        reset_peak_memory(dev)
        res.eval_s = median_seconds(forward, dev, 1 if args.warmup else 0, 1)
        res.eval_peak_gib = peak_memory_gib(dev)
    except Exception as e:
        res.eval_cell = failed(res, e, "eval:")


def run_scheme(args, scheme: str) -> Result:
    try:
        return measure(args, scheme)
    except Exception as e:  # OOM or a bug in one scheme must not end the table
        res = Result(scheme)
        res.cell = res.eval_cell = failed(res, e, "")
        return res
    finally:
        release_memory(args.device)


def add_overheads(results: list[Result]) -> None:
    """Percent more time per step than `none` measured in this run (same shapes, same process)."""
    none = next((r for r in results if r.scheme == "none" and r.sec_per_step), None)
    if none is None:
        return
    for r in results:
        if r.sec_per_step is not None:
            r.overhead_pct = (r.sec_per_step / none.sec_per_step - 1.0) * 100.0


def ratio_rows(results: list[Result], judge: bool = True) -> list[list[str]]:
    """One row per RATIOS pair whose two schemes both ran: ours and the paper's sec/step ratio
    (minus 1, in percent) and the goal, when there is one, with whether it is met. The goals are
    for the paper's model on a GPU: `judge` False (a CPU run) shows them without a verdict."""
    sec = {r.scheme: r.sec_per_step for r in results if r.sec_per_step}
    rows = []
    for num, den, goal in RATIOS:
        if num not in sec or den not in sec:
            continue
        ours = sec[num] / sec[den] - 1.0
        paper = PAPER_SEC_PER_STEP.get(num), PAPER_SEC_PER_STEP.get(den)
        paper_cell = f"{(paper[0] / paper[1] - 1.0) * 100:+.1f}%" if None not in paper else "- (no such row)"
        goal_cell = "-"
        if goal is not None:
            verdict = ("met" if ours <= goal else "not met") if judge else "a GPU goal, not judged here"
            goal_cell = f"<= {goal * 100:+.0f}%: {verdict}"
        rows.append([f"{num} vs {den}", f"{ours * 100:+.1f}%", paper_cell, goal_cell])
    return rows


def ratio_table(results: list[Result], judge: bool = True) -> str | None:
    rows = ratio_rows(results, judge)
    if not rows:
        return None
    return markdown_table(["sec/step ratio - 1", "ours (this run)", "paper Table 4 (A100, unfused)", "goal (issue 22)"],
                          rows, right={1, 2})


HEADERS = ["scheme", "backend", "params", "sec/step", "tokens/s", "peak GiB", "vs none", "note"]


def gib(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def table(results: list[Result], backend_choice: str = "auto", eval_length: int | None = None) -> str:
    """backend_choice: what was asked for (auto or a forced name); the column shows what ran.
    With eval_length, two more columns before the note: eval seconds and eval peak GiB."""
    rows = []
    for r in results:
        row = [r.scheme, r.backend, "-" if r.params is None else f"{r.params / 1e6:.2f} M",
               r.cell if r.sec_per_step is None else f"{r.sec_per_step:.4g}",
               "-" if r.tokens_per_s is None else f"{r.tokens_per_s:,.0f}", gib(r.peak_gib),
               "-" if r.overhead_pct is None else f"{r.overhead_pct:+.1f}%"]
        if eval_length:
            row += [r.eval_cell if r.eval_s is None else f"{r.eval_s:.4g}", gib(r.eval_peak_gib)]
        rows.append(row + ["; ".join(r.notes)])
    headers = [f"backend ({backend_choice})" if h == "backend" else h for h in HEADERS]
    if eval_length:
        headers[-1:-1] = [f"eval {eval_length} s", f"eval {eval_length} peak GiB"]
    return markdown_table(headers, rows, right=set(range(2, len(headers) - 1)))


def report(args, results: list[Result]) -> str:
    cfg, dev = args.cfg, args.device
    m = cfg.model
    micro, seq = shape(args, cfg)
    lines = ["## Training step per positional scheme (`tools/bench_train_step.py`, the paper's Table 4)"
             + (", CPU" if dev.type == "cpu" else ""), ""]
    if dev.type == "cpu":
        lines += ["**CPU figures: they say nothing about GPU speed** (smoke test of the tool).", ""]
    lines += environment_lines(dev, "tools/bench_train_step.py", args.argv)
    lines += [f"- model: {m.num_layers} layers, hidden {m.hidden_size}, {m.num_attention_heads} heads, vocab "
              f"{vocab_size(cfg)}, from {' + '.join(args.configs)}"
              + (f" with {' '.join(args.model_overrides)}" if args.model_overrides else ""),
              f"- micro-batch {micro} x {seq} tokens = {micro * seq} tokens/step, {args.precision}, activation "
              f"checkpointing {'on' if checkpointing(args, cfg) else 'off'}; "
              f"median of {args.steps} steps after {args.warmup} warmup",
              "- a step = forward + backward + grad clipping + AdamW on random tokens (no DeepSpeed, no data loader)",
              "- peak GiB: torch.cuda.max_memory_allocated over all steps"
              + ("; not measured on CPU ('-')" if dev.type == "cpu" else ""),
              "- vs none: sec/step over the `none` row of this run, minus 1",
              *([f"- eval {args.eval_length}: one batch-1 forward of {args.eval_length} tokens under no_grad "
                 "(token_losses, logits in 2048-token chunks), weights only in memory, seconds and peak GiB"]
                if args.eval_length else []),
              "", table(results, args.attention_backend, args.eval_length)]
    ratios = ratio_table(results, judge=dev.type == "cuda")
    if ratios:
        lines += ["", "The paper's Table 4 as ratios (same run; the paper's from its sec/step column):", "", ratios]
    profiles = {r.scheme: r.profile for r in results if r.profile}
    if profiles:
        what = "each kernel's device time" if dev.type == "cuda" else "each operator's own CPU time"
        lines += ["", f"Where a step's time goes (`--profile`: torch.profiler over 3 steps, {what}, ms per step; "
                  "the total is the profiled work; wall clock - total: on a GPU, time the device waited for the host):", "",
                  profile_tables(profiles, {r.scheme: r.sec_per_step for r in results if r.profile})]
    return "\n".join(lines) + "\n"


def progress(msg: str) -> None:
    print(f"[bench_train_step] {msg}", file=sys.stderr, flush=True)


def measure_order(schemes: list[str]):
    """Sort key: the first scheme asked for (the paper's, kerple_log by default), then the
    references its goals are ratios against (`none`, alibi), then the rest in the order given, so
    that a short --time-budget keeps the ratios that matter."""
    first = {schemes[0]: 0, "none": 1, "alibi": 2}
    return lambda s: (first.get(s, 3), schemes.index(s))


def run(args, on_scheme=None) -> tuple[list[Result], str]:
    """Measure every scheme; on_scheme(section), if given, gets the section of what is measured so
    far after each one, so a run killed at its timeout still leaves its finished rows behind."""
    done = {}
    for scheme in sorted(args.schemes, key=measure_order(args.schemes)):
        if args.budget.expired():
            done[scheme] = Result(scheme, cell="skipped", eval_cell="skipped", notes=[args.budget.skip_note()])
            continue
        progress(f"{scheme}: {args.warmup} warmup + {args.steps} timed steps")
        done[scheme] = run_scheme(args, scheme)
        if on_scheme is not None and len(done) < len(args.schemes):
            partial = [done[s] for s in args.schemes if s in done]
            add_overheads(partial)
            on_scheme(mark_partial(report(args, partial), f"partial: {len(done)} of {len(args.schemes)} "
                                   "schemes measured when this was written"))
    results = [done[s] for s in args.schemes]  # the table keeps the order asked for
    add_overheads(results)
    return results, report(args, results)


@dataclass
class Count:
    """--count-ops: one scheme's step, counted at each depth."""
    scheme: str
    backend: str = "-"
    ops: dict = field(default_factory=dict)  # layers -> benchmarks.step_ops.StepOps
    notes: list[str] = field(default_factory=list)


def count_backend(args, cfg) -> str:
    """The backend a count runs: the one --attention-backend names, else auto's choice on CUDA
    (on a CPU too: the Triton kernels are stand-ins there). Auto is asked with the embedding's
    dtype, as the model asks it (fp32 under autocast)."""
    if args.attention_backend != "auto" or args.device.type == "cuda":
        return args.attention_backend

    if args.count_path == "pipe":  # the layers' hidden states have the engine's dtype
        dtype = cfg.precision.torch_dtype
    else:
        dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    return resolve_backend("auto", build_scheme(cfg.model.pos_emb, positional_spec(cfg.model)), "cuda", dtype,
                           True).name


def model_step(args, cfg):
    """(optimizer, step) for --count-path model: train_step's, AdamW foreach."""
    model, vocab = build(args, cfg)
    optimizer, step = train_step(args, cfg, model, vocab, [])
    use_foreach(optimizer)  # CUDA's default; a CPU would loop over the parameters
    return optimizer, step


def pipe_step(args, cfg):
    """(optimizer, step) for --count-path pipe: step() is one train_batch of DeepSpeed's pipeline
    engine around GPTPipe (one stage) on random tokens, as deepy.py trains with pipe-parallel-size 1."""
    init_distributed(args.device)  # one process: the pipeline module needs a process group

    def optimizer_for(module):
        optimizer = build_optimizer(cfg, module)
        use_foreach(optimizer)  # CUDA's default; a CPU would loop over the parameters
        return optimizer

    torch.manual_seed(0)
    vocab = vocab_size(cfg)
    engine, _ = build_pipeline_engine(cfg, vocab, optimizer_for, lambda o: build_scheduler(cfg, o))
    micro, seq = shape(args, cfg)
    data = torch.randint(0, vocab, (micro, seq + 1), device=args.device)
    batch = ((data[:, :-1],), (data[:, 1:], torch.ones(micro, seq, device=args.device)))
    # DeepSpeed wraps the optimizer (bf16, ZeRO); the step counters are the inner one's
    return getattr(engine.optimizer, "optimizer", engine.optimizer), lambda: engine.train_batch(itertools.repeat(batch))


def count_ops(args, scheme: str) -> Count:
    """One step counted (after one uncounted step) at each of --count-layers depths."""
    res = Count(scheme)
    try:
        res.backend = count_backend(args, load(None, args, scheme))
        for layers in args.count_layers:
            extra = {"num-layers": layers, "attention-backend": res.backend}
            if args.count_path == "pipe":
                extra.update({"pipe-parallel-size": 1, "checkpoint-activations": checkpointing(args, args.cfg)})
                optimizer, step = pipe_step(args, load(None, args, scheme, extra))
            else:
                optimizer, step = model_step(args, load(None, args, scheme, extra))
            res.ops[layers] = count_step(step, optimizer, args.device)
            del optimizer, step
            release_memory(args.device)
    except Exception as e:  # one scheme's failure must not end the table
        res.notes.append(" ".join(str(e).split())[:300] or type(e).__name__)
    return res


def per_layer(counts: dict) -> str:
    """Launches per layer between the smallest and largest depth ('-' with one depth); marked when
    the depths in between are off that line (a count not affine in depth)."""
    if len(counts) < 2:
        return "-"
    (a, ca), (b, cb) = min(counts.items()), max(counts.items())
    slope = (cb - ca) / (b - a)
    affine = all(abs(ca + slope * (n - a) - c) < 1e-9 for n, c in counts.items())
    return f"{slope:g}" + ("" if affine else " (not affine in depth)")


def short_kernel(name: str) -> str:
    """attention_bwd_dq_kernel -> bwd_dq; aten::_scaled_dot_product_flash_attention_backward -> sdpa
    flash_attention_backward."""
    if name.startswith("aten::_scaled_dot_product_"):
        return "sdpa " + name.removeprefix("aten::_scaled_dot_product_")
    return name.removeprefix("attention_").removesuffix("_kernel")


def count_table(args, results: list[Count]) -> str:
    depths = args.count_layers
    launches = {r.scheme: {n: ops.launches for n, ops in r.ops.items()} for r in results}
    deepest = depths[-1]
    rows = []
    for r in results:
        own = launches[r.scheme]
        cells = [str(own.get(n, "-")) for n in depths]
        ops = r.ops.get(deepest)
        attention = "-" if ops is None else ", ".join(f"{short_kernel(k)} {v}" for k, v in sorted(ops.attention.items()))
        syncs = "-" if ops is None else str(len(ops.syncs))
        over = []
        for ref in ("alibi", "none"):
            theirs = launches.get(ref, {})
            diffs = [own[n] - theirs[n] for n in depths if n in own and n in theirs]
            over.append(" / ".join(f"{d:+d}" for d in diffs) if diffs and ref != r.scheme else "-")
        rows.append([r.scheme, r.backend, *cells, per_layer(own), attention, syncs, *over, "; ".join(r.notes)])
    at = " / ".join(str(n) for n in depths)
    headers = ["scheme", "backend", *[f"launches, {n} layers" for n in depths], "per layer",
               f"attention kernels, {deepest} layers", "host syncs", f"vs alibi ({at} layers)",
               f"vs none ({at} layers)", "note"]
    return markdown_table(headers, rows, right={*range(2, len(depths) + 3), len(depths) + 4})


def difference_rows(results: list[Count], depth: int) -> list[list[str]]:
    """Which operations one scheme dispatches beyond another (KERPLE-log over ALiBi, ALiBi over none)."""
    by = {r.scheme: r.ops.get(depth) for r in results}
    rows = []
    for a, b in (("kerple_log", "alibi"), ("alibi", "none"), ("kerple_log", "none")):
        if by.get(a) is None or by.get(b) is None:
            continue
        more, fewer = by[a].launch_ops() - by[b].launch_ops(), by[b].launch_ops() - by[a].launch_ops()
        text = ", ".join([f"{k.removeprefix('aten::')} +{v}" for k, v in sorted(more.items())]
                         + [f"{k.removeprefix('aten::')} -{v}" for k, v in sorted(fewer.items())])
        rows.append([f"{a} over {b}", f"{sum(more.values()) - sum(fewer.values()):+d}", text or "none"])
    return rows


def count_report(args, results: list[Count]) -> str:
    cfg, dev = args.cfg, args.device
    m = cfg.model
    micro, seq = shape(args, cfg)
    stand_in = dev.type != "cuda"
    pipe = args.count_path == "pipe"
    title = "## Operations per training step (`tools/bench_train_step.py --count-ops`)"
    if pipe:
        title = ("## Operations per training step through DeepSpeed's pipeline engine "
                 "(`tools/bench_train_step.py --count-ops --count-path pipe`)")
    precision = f"DeepSpeed {cfg.precision.dtype} (the config's)" if pipe else args.precision
    step = ("- a step = one train_batch of DeepSpeed's pipeline engine around GPTPipe (one stage, deepy.py's path "
            "for pipe-parallel-size 1): forward + backward + the engine's gradient clipping and optimizer step "
            "(the project's AdamW, foreach, inside DeepSpeed's optimizer for the precision) on random tokens"
            if pipe else
            "- a step = forward + backward + grad clipping + AdamW (foreach, CUDA's default) on random tokens")
    lines = [title, ""]
    lines += environment_lines(dev, "tools/bench_train_step.py", args.argv)
    lines += [f"- model: hidden {m.hidden_size}, {m.num_attention_heads} heads, vocab {vocab_size(cfg)}, from "
              f"{' + '.join(args.configs)}" + (f" with {' '.join(args.model_overrides)}" if args.model_overrides else "")
              + f", at {', '.join(map(str, args.count_layers))} layers",
              f"- micro-batch {micro} x {seq} tokens, {precision}, activation checkpointing "
              f"{'on' if checkpointing(args, cfg) else 'off'}; one step counted after one uncounted step",
              step,
              "- launches: the torch operations the step dispatches outside the attention kernels, each a kernel "
              "launch on a GPU (views, allocations and profiler markers excluded: benchmarks/step_ops.py); "
              "attention kernels: our Triton kernels' launches and torch's SDPA calls; host syncs: reads of a "
              "device value (and value-sized outputs), the optimizer's host-side step counters excluded",
              "- backend: " + ("auto's choice on CUDA; the Triton kernels are counted stand-ins that launch "
                               "nothing (their wrapper's torch work still runs and counts), so these are the "
                               "GPU's counts, but a GPU's torch may pick other implementations of some "
                               "operations" if stand_in else "what auto chose; the real step, kernels included"),
              "- vs alibi / vs none: launches minus that scheme's at the same depth", "",
              count_table(args, results)]
    diffs = difference_rows(results, args.count_layers[-1])
    if diffs:
        lines += ["", f"What the difference is made of ({args.count_layers[-1]} layers):", "",
                  markdown_table(["schemes", "launches", "operations (aten)"], diffs, right={1})]
    syncs = sync_rows(results, args.count_layers[-1])
    if syncs:
        lines += ["", f"Where the host syncs come from ({args.count_layers[-1]} layers; benchmarks/step_ops.py "
                      "StepOps.where, innermost frame first):", "",
                  markdown_table(["scheme", "syncs", "where"], syncs, right={1})]
    return "\n".join(lines) + "\n"


def sync_rows(results: list[Count], depth: int) -> list[list[str]]:
    """Each scheme's host syncs at `depth`, by where they came from (the three innermost frames)."""
    rows = []
    for r in results:
        ops = r.ops.get(depth)
        if ops is None:
            continue
        where = Counter(" <- ".join(w.split(" <- ")[:3]) or "?" for w in ops.where)
        rows += [[r.scheme, str(n), f"`{w}`"] for w, n in where.items()]
    return rows


def run_counts(args) -> tuple[list[Count], str]:
    results = []
    for scheme in args.schemes:
        progress(f"{scheme}: counting one step at {', '.join(map(str, args.count_layers))} layers")
        results.append(count_ops(args, scheme))
    return results, count_report(args, results)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)

    def write(text: str) -> None:
        replace_section(args.out, args.section, text)

    if args.count_ops:
        _, text = run_counts(args)
    else:
        _, text = run(args, on_scheme=write if args.out else None)
    print(text)
    if args.out:
        write(text)
        progress(f"wrote section {args.section!r} of {args.out}")
    return 0
