"""Perplexity of checkpoints at many lengths, each checkpoint in one process pass (the paper's
extrapolation evaluation).

    python evaluate.py --checkpoint runs/quickstart/checkpoints --lengths 128,256,512 --out runs/quickstart/eval_3lengths
    python evaluate.py --checkpoint CKPT                 # default: 1x, 2x, ... 32x the train length
    python evaluate.py --checkpoint A B C --out results  # several checkpoints: results/<name>/ (below)
    python evaluate.py --checkpoint CKPT --window 128 --out eval_window128   # windowed attention (windowed@L)
    python evaluate.py --checkpoint CKPT --stride 64 --out eval_stride64     # sliding-window (strided) evaluation
    python evaluate.py --checkpoint CKPT --blockwise-causal --out eval_blockwise   # xPos's blockwise causal
    python evaluate.py --checkpoint CKPT -o rotary-scaling=yarn -o rotary-scaling-factor=16 --out eval_yarn16
    python evaluate.py --checkpoint CKPT --tasks kerple_local --max-length 512   # downstream tasks

--tasks runs lm-evaluation-harness tasks (the offline local ones: kerple_local; your own task YAML
with --include-path DIR; the standard ones where their datasets can be reached) instead of the
perplexity sweep, at contexts of up to --max-length tokens (default: the training length; longer
extrapolates), and writes harness.json into the same output directory (see megatron/evaluation/harness/);
with --limit N, harness_limitN.json (a smoke test, not comparable: the full harness.json stays).

Windows: by default the first --max-windows (320, the paper's count) in NeoX's shuffled sample order
of the split, seeded by --data-seed; --window-order contiguous takes the first ones in stream order.
A length whose split holds fewer windows than asked gets a warning and records both counts.

Writes eval.json (schema kerple-eval/1: lengths -> perplexity, per-position loss, window order and
data seed), eval.csv, eval.md and positionwise.csv into --out (default: <checkpoint>/../eval). The output directory is
checked before anything is loaded; while the lengths run, the finished ones are kept in
eval.partial.json there (removed once eval.json is written), so a failure loses none of them.

With several checkpoints each gets its own results/<name>/: the checkpoint directory's name (its
run directory's, for runs/<run>/checkpoints); names that coincide (x/run1 and y/run1) take parent
directories until they differ (results/x_run1, results/y_run1). No result is ever written into a
checkpoint directory (--out there is refused), and the same checkpoint given twice is refused.

Over several processes (DeepSpeed's launcher, torchrun: RANK/WORLD_SIZE; srun: SLURM_PROCID/SLURM_NTASKS;
`python deepy.py evaluate.py CONFIG.yml [hostfile.yml] [these flags]` evaluates the config's load/save that
way) each rank scores its part of every length's windows and rank 0 writes the one result, equal to one
process's (megatron/evaluation/spread.py); --tasks runs in one process.

Results are never replaced silently: an output directory that already holds this mode's results
(eval.json ... for the sweep, harness.json for --tasks; the other mode's are not touched) is
refused unless --overwrite, and while an evaluation runs it holds the directory's eval.lock, so a
second evaluation into the same --out is refused at once, naming the first.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

from megatron.atomic_io import atomic_output
from megatron.checkpoint.tags import resolve_tag, tag_or_latest
from megatron.checkpoint.trust import add_load_flags, apply_trust_flag
from megatron.cli_args import ArgumentParser, int_at_least
from megatron.config import NeoXConfig
from megatron.config.overrides import parse_overrides
from megatron.data.identity import check_tokenizer
from megatron.device import add_device_flag, describe, resolve_device
from megatron.errors import DataError, OutOfMemory, UserError, is_out_of_memory, out_of_memory, writing
from megatron.evaluation.harness.cli import add_eval_flags, limit_value, progress_bars, results_path, ruler_lengths
from megatron.evaluation.harness.run import check_max_length_value
from megatron.evaluation.harness.run import evaluate_tasks as run_tasks
from megatron.evaluation.outputs import (
    check_output_dir,
    checkpoint_name,
    output_lock,
    output_locks,
    refuse_earlier_results,
    results_dirs,
)
from megatron.evaluation.report import RESULT_FILES, attention_label, build_record, markdown_table, write_outputs
from megatron.evaluation.results import parse_result
from megatron.evaluation.retrieval.grid import SCORINGS, RetrievalSpec
from megatron.evaluation.retrieval.prompts import FILLERS, TASKS, parse_depths
from megatron.evaluation.retrieval.summary import markdown as retrieval_markdown
from megatron.evaluation.spread import ONE_PROCESS, EvalGroup, quiet_peers, rank0_speaks, rank_device
from megatron.evaluation.windows import WINDOW_ORDERS
from megatron.outputs_vs_inputs import refuse_overlap
from megatron.process.metrics_file import read_metrics
from megatron.process.ranks import launch_ranks

PARTIAL = "eval.partial.json"  # not eval.json: globs and run_matrix's "done" check must not take it


PLOTS_ENV = "KERPLE_EVAL_PLOTS"


def parse_args(argv=None, cfg=None):
    """cfg: the config `deepy.py evaluate.py CONFIG` resolved (it stands for --resolved-config)."""
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", nargs="+", help="directories holding `latest` and global_step<N>/")
    p.add_argument("--resolved-config", default=None,
                   help="a config written by deepy.py: evaluate the checkpoint its `load` (else `save`) names")
    p.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # DeepSpeed's launcher adds it
    p.add_argument("--iteration", type=int_at_least(0), default=None, help="evaluate global_step<N> instead of latest")
    p.add_argument("--lengths", default=None, help="comma-separated lengths (default: 1x..--max-factor x train length)")
    p.add_argument("--max-factor", type=int_at_least(1), default=32, help="largest multiple of the train length (default 32)")
    p.add_argument("--split", choices=("test", "valid"), default="test")
    p.add_argument("--max-windows", type=int_at_least(1), default=None,
                   help="windows per length (default: the paper's 320 unless --max-tokens is given)")
    p.add_argument("--max-tokens", type=int_at_least(1), default=None,
                   help="token budget per length (max-tokens // L windows); with --window-order contiguous every "
                        "length then covers the same leading tokens of the split")
    p.add_argument("--window-order", choices=WINDOW_ORDERS, default="shuffled",
                   help="which windows of the split: 'shuffled' = the first ones in NeoX's seeded sample order, as "
                        "the paper drew its 320 per length (default); 'contiguous' = the first ones in stream order "
                        "(the same leading tokens at every length)")
    p.add_argument("--equal-text", type=int_at_least(0), default=0, metavar="SPANS",
                   help="also score every length on the SAME text: SPANS spans of train-length tokens at fixed "
                        "places of the split's stream, each read with the length's context before it "
                        "(megatron/evaluation/equal_text.py); printed beside the per-length perplexity, which "
                        "scores each length on its own windows (default 0: off)")
    p.add_argument("--min-doc-tokens", type=int_at_least(1), default=None, metavar="N",
                   help="score only the split's documents of at least N tokens (e.g. a corpus's long documents)")
    p.add_argument("--batch-size", type=int_at_least(1), default=1)
    p.add_argument("--window", type=int_at_least(1), default=None, help="sliding-window attention W at eval time")
    p.add_argument("--stride", type=int_at_least(1), default=None,
                   help="strided evaluation: windows of each length advance by this many tokens, scoring only "
                        "the new ones (budget: --max-tokens, default 65536)")
    p.add_argument("--blockwise-causal", type=int_at_least(0, "(0 or no value: train length / 2)"), nargs="?", const=0,
                   default=None, metavar="BLOCK",
                   help="blockwise causal attention (xPos paper): blocks of BLOCK tokens (default: train length / 2), "
                        "each query sees its own block and the previous one")
    p.add_argument("--attention-backend", default=None, help="override the attention backend")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key of the checkpoint, e.g. -o data-path=data/x/x_text_document")
    p.add_argument("--data-seed", type=int_at_least(0), default=None,
                   help="seed of the split's document order (default: the checkpoint's training seed, as the paper); "
                        "fix it to compare runs of different seeds on the same tokens under a --max-tokens budget")
    p.add_argument("--dataset", default=None, help="dataset name recorded in eval.json (default: from data-path)")
    p.add_argument("--out", default=None, help="output directory (with several checkpoints: one subdirectory each)")
    p.add_argument("--plots", action=argparse.BooleanOptionalAction, default=os.environ.get(PLOTS_ENV, "1") != "0",
                   help="write ppl_vs_length.png, positionwise.png and (for a score-bias scheme) kernels.png beside "
                        f"eval.json (default on; {PLOTS_ENV}=0 makes --no-plots the default, e.g. in batch jobs)")
    add_retrieval_flags(p)
    add_device_flag(p)
    add_eval_flags(p, batch_size=False)  # --tasks: downstream tasks instead of the perplexity sweep; --quiet
    add_load_flags(p)
    args = p.parse_args(argv)
    from_config = cfg is not None or args.resolved_config
    if bool(args.checkpoint) == bool(from_config):
        p.error("the checkpoint comes from --checkpoint DIR, or from the config's load (else save) when deepy.py "
                "starts evaluate.py (--resolved-config): give exactly one of them" if args.checkpoint
                else "the following arguments are required: --checkpoint")
    sweep_only = [f for f, v in (("--lengths", args.lengths), ("--stride", args.stride), ("--window", args.window))
                  if v is not None]
    if args.stride and args.min_doc_tokens:
        p.error("--min-doc-tokens applies to the non-overlapping sweep, not to --stride")
    if args.eval_tasks and sweep_only:
        p.error(f"{', '.join(sweep_only)} belong to the perplexity sweep, not to --tasks: run them separately")
    if not args.eval_tasks and any(v is not None for v in (args.max_length, args.limit, args.num_fewshot,
                                                           args.eval_results_prefix, args.include_paths,
                                                           args.bootstrap_iters, args.ruler_lengths)):
        p.error("--max-length, --limit, --num-fewshot, --include-path, --bootstrap-iters, --ruler-lengths and "
                "--eval_results_prefix apply to --tasks (the perplexity sweep takes --lengths)")
    if args.eval_results_prefix and len(args.checkpoint) > 1:
        p.error("--eval_results_prefix names one results file: give one --checkpoint (or use --out)")
    args.limit = limit_value(args.limit)
    if from_config:
        # lazy: pulls in torch, only for deepy.py's --resolved-config; --help needs none
        from megatron.checkpoint.load_model import config_checkpoint

        cfg = cfg if cfg is not None else NeoXConfig.from_file(args.resolved_config)
        args.checkpoint = [config_checkpoint(cfg)]
        if args.iteration is None:
            args.iteration = cfg.checkpoint.iteration
    return args


def add_retrieval_flags(p) -> None:
    g = p.add_argument_group("retrieval at length (megatron/evaluation/retrieval/; docs/evaluation.md)")
    g.add_argument("--retrieval", default=None, metavar="TASKS",
                   help=f"also measure retrieval at the same lengths: comma-separated tasks of {', '.join(TASKS)} "
                        "(passkey: a number hidden in filler; kv: key-value needles with distractors, RULER's "
                        "multi-key form); eval.json gains a retrieval section, retrieval_<task>.jsonl holds every "
                        "prompt and score, retrieval_<task>.png the depth x length heatmap")
    g.add_argument("--retrieval-depths", default="0,25,50,75,100", metavar="PERCENTS",
                   help="needle depths, percent of the filler before the needle (default 0,25,50,75,100)")
    g.add_argument("--retrieval-prompts", type=int_at_least(1), default=50, metavar="N",
                   help="prompts per length x depth cell (default 50)")
    g.add_argument("--retrieval-candidates", type=int, default=10, metavar="K",
                   help="multiple choice among K values of the answer's format (chance 1/K; default 10)")
    g.add_argument("--retrieval-filler", choices=FILLERS, default="split",
                   help="the haystack: 'split' = the evaluation split's own text (default), 'sentences' = the "
                        "classic repeated sentences of passkey retrieval")
    g.add_argument("--retrieval-scoring", choices=SCORINGS, default="both",
                   help="'choice' = multiple choice by likelihood only; 'generate'/'both' = also greedy "
                        "generation through the kv-cache, exact match (default both)")
    g.add_argument("--retrieval-threshold", type=float, default=0.8, metavar="ACC",
                   help="the effective length is the longest length whose accuracy over all depths, and every "
                        "shorter length's, is at least ACC (default 0.8)")
    g.add_argument("--retrieval-seed", type=int_at_least(0), default=1234,
                   help="seed of the prompts (values, keys, filler offsets; default 1234): the same prompts on "
                        "every machine and rank count")


def retrieval_spec(args) -> RetrievalSpec | None:
    """The retrieval flags as one checked spec (None without --retrieval), before any checkpoint loads."""
    if not args.retrieval:
        return None
    spec = RetrievalSpec(tuple(t.strip() for t in args.retrieval.split(",") if t.strip()),
                         tuple(parse_depths(args.retrieval_depths)), args.retrieval_prompts,
                         args.retrieval_candidates, args.retrieval_filler, args.retrieval_scoring,
                         args.retrieval_threshold, args.retrieval_seed, args.batch_size)
    spec.check()
    return spec


def parse_lengths(text: str) -> list[int]:
    try:
        lengths = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--lengths {text!r} must be comma-separated integers, e.g. 512,1024") from None
    if not lengths or min(lengths) < 1:
        raise UserError(f"--lengths {text!r} must list positive integers")
    return lengths


def data_source(cfg, split: str) -> tuple[str, str]:
    """(prefix, split string) for the requested split."""
    d = cfg.data
    if d.single_path:
        return d.single_path, d.split
    paths = d.test_data_paths if split == "test" else d.valid_data_paths
    if not paths and d.data_path:  # train-data-paths without this split's own: the data-path's split
        return d.data_path, d.split
    if not paths:
        raise UserError(f"the checkpoint's config has no data-path and no {split}-data-paths; "
                        "pass -o data-path=<prefix>")
    return paths[0], "0,0,1" if split == "test" else "0,1,0"


def train_speed(cfg) -> dict | None:
    """sec/step of the training run (median of its logged steps after the first), if logged."""
    path = os.path.join(cfg.logging.run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        return None

    try:
        rows = read_metrics(path)  # skips a killed writer's partial last line
    except DataError as e:  # optional information: a damaged file must not cost the evaluation
        print(f"evaluate.py: warning: no train_speed: {e}", file=sys.stderr)
        return None
    steps = [r["elapsed_time_per_iteration_ms"] for r in rows if r.get("kind") == "train"]
    ms = sorted(steps[1:] or steps)  # the first step pays for warm-up
    return {"sec_per_step": ms[len(ms) // 2] / 1000.0, "steps": len(steps)} if ms else None


def output_dir(args, ckpt: str) -> str:
    return results_dirs(args.checkpoint, args.out)[ckpt]


def oom_fix(args, done: list, partial: str) -> str:
    """What to try after running out of memory at one length, and where the finished lengths are."""
    fused = "triton" if str(args.device).startswith("cuda") else "flex"
    fix = (("use --batch-size 1, " if args.batch_size > 1 and not args.stride else "")
           + f"a fused attention backend (--attention-backend {fused}) or drop the longest --lengths")
    if done:
        fix += f"; lengths {', '.join(str(r.length) for r in done)} finished: their results are in {partial}"
    return fix


def run_lengths(args, model, cfg, lengths, prefix, split, partial: str, save_partial, block: int | None = None,
                group: EvalGroup = ONE_PROCESS) -> list:
    """Evaluate every length in order, its windows shared by the group's ranks; `save_partial(results)`
    after each (on rank 0) keeps the finished ones. block: blockwise causal attention's block size, or None."""
    # lazy: torch (the model's evaluation); the flag and output checks need none
    from megatron.evaluation.lengths import evaluate_length
    from megatron.evaluation.strided import evaluate_strided

    max_windows = args.max_windows if (args.max_windows or args.max_tokens) else 320
    seed = cfg.training.seed if args.data_seed is None else args.data_seed
    results, progress = [], not args.quiet and group.is_rank0
    for L in lengths:
        try:
            if args.stride:
                r = evaluate_strided(model, prefix, split, args.split, L, min(args.stride, L), seed,
                                     args.max_tokens or 65536, args.device, cfg.data.data_cache_dir, progress, group)
            else:
                r = evaluate_length(model, prefix, split, args.split, L, seed, max_windows,
                                    args.max_tokens, args.batch_size, args.device, cfg.data.data_cache_dir,
                                    progress=progress, window_order=args.window_order,
                                    blockwise_causal=block, min_doc_tokens=args.min_doc_tokens, group=group)
        except Exception as e:
            if not is_out_of_memory(e):
                raise
            what = f"evaluating length {L}" + (f" with stride {args.stride}" if args.stride
                                               else f" with batch size {args.batch_size}")
            oom = out_of_memory(e, what, oom_fix(args, results, partial))
            oom.said_by_rank0 = getattr(e, "said_by_rank0", False)  # agreed in the group: rank 0 says it
            raise oom from e
        results.append(r)
        group.on_rank0(say_length, args, r, results, save_partial)
    return results


def say_length(args, r, results: list, save_partial) -> None:
    """Rank 0: one length's line (and warning), and the finished lengths kept in eval.partial.json."""
    if r.windows_per_rank:
        spread = f", {'+'.join(map(str, r.windows_per_rank))} over {len(r.windows_per_rank)} ranks"
    else:
        spread = ""
    print(f"length {r.length:>6}: loss {r.loss:.4f}  ppl {r.ppl:10.3f}  ({r.windows} windows{spread}, "
          f"{r.seconds:.1f}s)", flush=True)
    if r.short:
        print(f"evaluate.py: warning: length {r.length}: the {args.split} split holds only {r.windows} windows of "
              f"{r.length + 1} tokens, fewer than the {r.requested} asked for; its perplexity is noisier than the "
              "others' (eval.json records both counts)", file=sys.stderr, flush=True)
    save_partial(results)


def checkpoint_overrides(args) -> dict:
    overrides = parse_overrides(args.override)
    if args.window is not None:
        overrides["attention-window"] = args.window
    if args.attention_backend:
        overrides["attention-backend"] = args.attention_backend
    return overrides


def evaluate_tasks(args, ckpt: str) -> None:
    """--tasks: the harness on this checkpoint; harness.json beside the perplexity results."""
    run_tasks(ckpt, args.eval_tasks, output_dir(args, ckpt), tag=tag_or_latest(args.iteration),
              results_path=results_path(args.eval_results_prefix),
              overrides=checkpoint_overrides(args), max_length=args.max_length, batch_size=args.batch_size,
              limit=args.limit, num_fewshot=args.num_fewshot, device=args.device, allow_nonfinite=args.allow_nonfinite,
              include_paths=args.include_paths, bootstrap_iters=args.bootstrap_iters, overwrite=args.overwrite,
              ruler_lengths=ruler_lengths(args.ruler_lengths))


def load_for_sweep(args, ckpt: str):
    """The model and everything the sweep needs from the checkpoint, refused before any length."""
    # lazy: torch (the model); --help and the checks of check_command need none
    from megatron.checkpoint.load_model import load_checkpoint_model
    from megatron.evaluation.blockwise import check_block
    from megatron.evaluation.lengths import default_lengths

    overrides = checkpoint_overrides(args)
    model, cfg, client = load_checkpoint_model(ckpt, tag_or_latest(args.iteration), overrides, args.device, args.allow_nonfinite)
    train_len = cfg.model.seq_length
    block = None if args.blockwise_causal is None else check_block(args.blockwise_causal, train_len)
    lengths = parse_lengths(args.lengths) if args.lengths else default_lengths(train_len, args.max_factor)
    limit = model.position.max_length()
    if limit and max(lengths) > limit:
        raise UserError(f"pos-emb {cfg.model.pos_emb} cannot represent lengths {[x for x in lengths if x > limit]} "
                        f"(max {limit}); drop them from --lengths")
    prefix, split = data_source(cfg, args.split)

    check_tokenizer(prefix, cfg.data)  # data written by another tokenizer: refused before any length
    retrieval = load_retrieval(args, model, cfg, lengths, (prefix, split, args.split))
    return model, cfg, client, overrides, block, lengths, prefix, split, retrieval


def load_retrieval(args, model, cfg, lengths: list[int], data: tuple[str, str, str]):
    """(spec, tokenizer, {task: prompt maker}) for --retrieval, every refusal made before any work
    (a tokenizer that cannot spell the needles, a length too short for the text or too long for
    memory); None without --retrieval."""
    # lazy: torch and the tokenizer libraries, only with --retrieval
    from megatron.evaluation.retrieval.grid import check_lengths, prompt_maker
    from megatron.tokenizer import build_tokenizer

    spec = retrieval_spec(args)
    if spec is None:
        return None
    d = cfg.data
    tokenizer = build_tokenizer(d.tokenizer_type, d.vocab_file, d.merge_file)
    makers = {task: prompt_maker(spec, task, tokenizer, data) for task in spec.tasks}
    check_lengths(spec, makers, lengths, model, args.device)
    return spec, tokenizer, makers


def evaluate_checkpoint(args, ckpt: str, group: EvalGroup = ONE_PROCESS) -> None:
    # every rank loads the model (a failure on any one is agreed: spread.py)
    model, cfg, client, overrides, block, lengths, prefix, split, retrieval = group.agree(load_for_sweep, args, ckpt)
    train_len = cfg.model.seq_length
    start = time.perf_counter()
    out_dir = output_dir(args, ckpt)
    partial = os.path.join(out_dir, PARTIAL)
    meta = {
        "checkpoint": os.path.abspath(ckpt), "iteration": client.get("iteration"),
        "pos_emb": cfg.model.pos_emb, "seed": cfg.training.seed, "train_length": train_len,
        "data_seed": cfg.training.seed if args.data_seed is None else args.data_seed,
        "dataset": args.dataset or os.path.basename(prefix).removesuffix("_text_document"),
        "split": args.split, "window": cfg.model.attention_window,
        "mode": "strided" if args.stride else "non-overlapping", "stride": args.stride,
        # strided evaluation reads the leading tokens of the stream, whatever --window-order says
        "window_order": "contiguous" if args.stride else args.window_order,
        "blockwise_causal": block, "min_doc_tokens": args.min_doc_tokens,
        "overrides": dict(overrides),  # e.g. rotary-scaling set for this evaluation
        "data_path": prefix, "device": str(args.device), "lengths": lengths,
        "device_name": describe(args.device),  # which GPU (or CPU) scored it (rank 0's): the report names it
        "ranks": group.world_size,  # processes that shared the windows (the result is one process's)
        "train_speed": train_speed(cfg),
    }

    if group.is_rank0:
        print(f"evaluating {ckpt} (iteration {meta['iteration']}, pos-emb {meta['pos_emb']}): "
              f"{attention_label(meta)}, lengths {', '.join(map(str, lengths))}", flush=True)

    saved = []  # the lengths eval.partial.json holds (a failed save keeps the previous one whole)

    def save_partial(done: list) -> None:
        os.makedirs(out_dir, exist_ok=True)
        rec = build_record(dict(meta, lengths=[r.length for r in done], incomplete=True,
                                seconds=round(time.perf_counter() - start, 2)), done)
        with atomic_output(partial, fsync=False) as tmp, open(tmp, "w") as f:
            json.dump(rec, f, indent=1)
        saved[:] = [r.length for r in done]

    def kept() -> str:
        if not saved:
            return "no length had finished, so no result was kept"
        return f"lengths {', '.join(map(str, saved))} finished and are kept in {partial}"

    def write(results: list, found: dict) -> None:  # rank 0: the result files, the table and the plots
        rec = build_record(dict(meta, seconds=round(time.perf_counter() - start, 2)), results)
        if found:
            rec["retrieval"] = {task: section for task, (section, _) in found.items()}
            written = write_retrieval(found, out_dir, args.plots, f"{checkpoint_name(ckpt)}, {cfg.model.pos_emb}",
                                      train_len)
        paths = write_outputs(rec, results, out_dir)
        if os.path.exists(partial):
            os.remove(partial)  # eval.json now holds every length
        print(markdown_table(rec))
        plots = write_plots(paths["json"], model, cfg, max(lengths), out_dir, checkpoint_name(ckpt)) if args.plots else []
        plots += written if found else []
        print(f"wrote {paths['json']}, {paths['csv']}, {paths['md']}, {paths['positionwise']}"
              + "".join(f", {p}" for p in plots))

    with writing("the results into", out_dir, kept):  # a full disk: where, and what is kept
        results = run_lengths(args, model, cfg, lengths, prefix, split, partial, save_partial, block, group)
        if args.equal_text:
            meta["equal_text"] = run_equal_text(args, model, cfg, lengths, prefix, split, group)
        found = run_retrieval(retrieval, model, lengths, args, group)
        group.on_rank0(write, results, found)


def run_equal_text(args, model, cfg, lengths: list[int], prefix: str, split: str, group: EvalGroup) -> dict:
    """--equal-text: the same train-length spans scored at every length (megatron/evaluation/equal_text.py)."""
    from megatron.evaluation.equal_text import evaluate_equal_text  # lazy: torch

    seed = cfg.training.seed if args.data_seed is None else args.data_seed
    try:
        equal = evaluate_equal_text(model, prefix, split, args.split, lengths, cfg.model.seq_length, args.equal_text,
                                    seed, args.device, cfg.data.data_cache_dir, group)
    except ValueError as e:
        raise UserError(f"--equal-text {args.equal_text}: {e}") from e
    if group.is_rank0 and not args.quiet:
        for length in lengths:
            print(f"length {length:>6}: equal text ppl {equal[str(length)]['ppl']:10.3f}  (the same "
                  f"{equal['spans']} x {equal['scored_tokens_per_span']} tokens at every length)", flush=True)
    return equal


def run_retrieval(retrieval, model, lengths: list[int], args, group: EvalGroup) -> dict:
    """{task: (eval.json section, sample rows)} at the sweep's lengths; {} without --retrieval."""
    if retrieval is None:
        return {}
    from megatron.evaluation.retrieval.grid import run_task  # lazy: torch

    spec, tokenizer, makers = retrieval
    say = None if args.quiet else (lambda line: print(line, flush=True))
    return {task: run_task(model, tokenizer, maker, spec, lengths, args.device, group, say)
            for task, maker in makers.items()}


def write_retrieval(found: dict, out_dir: str, plots: bool, title: str, train_length: int) -> list[str]:
    """Rank 0: retrieval_<task>.jsonl (every prompt and score) and, with plots, retrieval_<task>.png;
    the tables printed. Returns the paths written."""
    written = []
    for task, (section, samples) in found.items():
        path = os.path.join(out_dir, f"retrieval_{task}.jsonl")
        with atomic_output(path, fsync=False) as tmp, open(tmp, "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in samples)
        section["samples"] = os.path.basename(path)
        written.append(path)
        print(retrieval_markdown(task, section, train_length))
        if plots:
            from megatron.evaluation import plots as figures  # lazy: matplotlib

            for scoring in section["scorings"]:
                suffix = "" if scoring == "choice" else "_exact"
                written.append(figures.plot_retrieval_heatmap(
                    section, os.path.join(out_dir, f"retrieval_{task}{suffix}.png"), f"{title}: {task}", scoring))
    return written


def write_plots(eval_json: str, model, cfg, max_length: int, out_dir: str, name: str) -> list[str]:
    """The pictures of one evaluation, from the eval.json just written (the plots tools/make_report.py
    draws for many runs, in their single-run form: megatron/evaluation/plots.py): perplexity against
    length on an axis spanning at least PPL_MIN_SPAN, the position-wise loss averaged over at least
    MIN_TOKENS_PER_POINT tokens a point, and the learned kernel f_h(d) of a score-bias scheme up to the
    longest length evaluated, titled with the run (`name`) and its step."""
    # lazy: matplotlib and torch, only with --plots
    from megatron.evaluation import plots
    from megatron.evaluation.kernels import kernel_of_scheme

    run = parse_result(eval_json)
    step = f", step {run.iteration}" if run.iteration is not None else ""
    out = [plots.plot_ppl_vs_length([run], os.path.join(out_dir, "ppl_vs_length.png"),
                                    title=f"{name}{step}: perplexity vs length", min_span=plots.PPL_MIN_SPAN),
           plots.plot_positionwise([run], os.path.join(out_dir, "positionwise.png"), title=f"{name}{step}",
                                   min_tokens=plots.MIN_TOKENS_PER_POINT)]
    kernel = kernel_of_scheme(model.position, max_length)
    if kernel is not None:
        out.append(plots.plot_kernels({f"{cfg.model.pos_emb}{step}": kernel}, os.path.join(out_dir, "kernels.png"),
                                      train_length=cfg.model.seq_length, title=name,
                                      panel_size=plots.KERNEL_PANEL_SINGLE, fontsize=plots.KERNEL_FONT_SINGLE))
    return out


def main(argv=None) -> int:
    return quiet_peers(run, argv)  # several ranks: rank 0 says the group's failures, once


def run(argv=None) -> int:
    ranks = launch_ranks()  # one process, or this rank of a launch (DeepSpeed, torchrun, srun)
    with rank0_speaks():
        args = parse_args(argv)
    apply_trust_flag(args)
    # the ranks meet first (a device type and a rendezvous: no file is read), so that every check
    # below is made once, by rank 0, and a refusal ends every rank with its one message
    group = EvalGroup.start(ranks, resolve_device(args.device)) if ranks.world_size > 1 else ONE_PROCESS
    try:
        group.on_rank0(check_command, args, group.world_size > 1)
        args.device = group.agree(rank_device, args.device, ranks, "evaluate.py")
        with contextlib.ExitStack() as held:  # rank 0 holds each output directory's lock while all evaluate
            group.on_rank0(lambda: held.enter_context(output_locks(list(dict.fromkeys(
                output_dir(args, c) for c in args.checkpoint)))))
            return evaluate_all(args, group)
    finally:
        group.close()


def check_command(args, several: bool = False) -> None:
    """Every check that needs no model, before anything is loaded (evaluate.py's own start, and
    `deepy.py evaluate.py` before it writes or launches anything): the flags, the output
    directories (writable, no earlier results unless --overwrite, no evaluation running there) and
    the checkpoint's step."""
    if args.lengths:
        parse_lengths(args.lengths)  # a bad --lengths fails before any checkpoint is loaded
    if args.equal_text and (args.eval_tasks or args.stride or args.blockwise_causal is not None):
        raise UserError("--equal-text scores beside the non-overlapping perplexity sweep with plain causal attention: "
                        "drop --tasks / --stride / --blockwise-causal")
    if retrieval_spec(args) and (args.eval_tasks or args.stride):
        raise UserError("--retrieval runs beside the non-overlapping perplexity sweep: drop --tasks / --stride")
    if args.blockwise_causal is not None and (args.stride or args.window):
        raise UserError("--blockwise-causal is its own attention pattern: drop --stride / --window")
    if args.eval_tasks:
        if several:
            raise UserError("--tasks runs the lm-evaluation-harness in one process (its requests are not split "
                            "over ranks), and several ranks would each run every task into the same harness.json: "
                            "run it as one process (python evaluate.py --tasks ..., or deepy.py with num-gpus: 1 "
                            "and no hostfile); the perplexity sweep (without --tasks) is the one spread over ranks")

        check_max_length_value(args.max_length)  # before any checkpoint is loaded

    refuse_overlap("--eval_results_prefix", args.eval_results_prefix,
                   [("the checkpoint being evaluated (--checkpoint)", c) for c in args.checkpoint])

    for ckpt in args.checkpoint:  # every output directory (none inside a checkpoint), before hours of evaluation
        check_output_dir(output_dir(args, ckpt))
        refuse_earlier_results(output_dir(args, ckpt), result_names(args), args.overwrite)
        output_lock(output_dir(args, ckpt)).check_free()  # an evaluation writing there now
    if len(args.checkpoint) == 1:  # a missing checkpoint is answered before torch loads (several: skipped)
        resolve_tag(args.checkpoint[0], tag_or_latest(args.iteration))


def result_names(args) -> list[str]:
    """The files the perplexity sweep writes into its output directory, the one written last first
    (--tasks checks its harness.json itself, once the task names are known to be right)."""
    if args.eval_tasks:
        return []
    return [RESULT_FILES["json"], *(n for k, n in RESULT_FILES.items() if k != "json")]


def evaluate_all(args, group: EvalGroup = ONE_PROCESS) -> int:
    failed = []
    for ckpt in args.checkpoint:
        try:
            with progress_bars(not args.quiet and group.is_rank0):  # --quiet: the harness's and datasets' bars too
                if args.eval_tasks:
                    evaluate_tasks(args, ckpt)  # one process (check_command refuses several ranks)
                else:
                    evaluate_checkpoint(args, ckpt, group)
        except ValueError as e:  # UserError, or the data/interop code's plain ValueErrors
            if len(args.checkpoint) == 1 or isinstance(e, OutOfMemory) or getattr(e, "fatal", False):
                raise
            failed.append(ckpt)  # the others can still be evaluated (every rank skips alike: spread.py)
            if group.is_rank0:
                print(f"evaluate.py: skipping {ckpt}: {e}", file=sys.stderr, flush=True)
    if failed:
        raise group.fail(f"{len(failed)} of {len(args.checkpoint)} checkpoints could not be evaluated "
                         f"(see above): {', '.join(failed)}")
    return 0

