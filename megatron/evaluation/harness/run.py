"""Run harness tasks on one checkpoint: check the inputs (task names, --max-length) before the
long part, evaluate, write the results JSON beside the extrapolation results, log the scores to
TensorBoard/W&B when the run's config turns them on, print the harness's results table.

Used by eval.py (`python deepy.py eval.py CONFIG.yml --eval_tasks ...`) and evaluate.py --tasks.
"""
from __future__ import annotations

import inspect
import json
import os
import time

from megatron.atomic_io import atomic_output
from megatron.errors import UserError
from megatron.evaluation.harness import ruler
from megatron.evaluation.harness.task_checks import check_include_paths, check_task_docs, check_tasks, task_manager
from megatron.evaluation.outputs import refuse_earlier_results
from megatron.process.logging import MetricsLogger, tensorboard_dir
from megatron.tokenizer import build_tokenizer

SCHEMA = "kerple-harness/1"
RESULTS_NAME = "harness.json"


def results_name(limit) -> str:
    """The results file in the output directory: harness.json for a full evaluation; with --limit N
    harness_limitN.json, since N documents per task is a smoke test whose scores are not comparable
    with a full run's, and must never replace the full harness.json."""
    return RESULTS_NAME if limit is None else f"harness_limit{limit:g}.json"


def limit_note(limit) -> str:
    """What a limited evaluation is, said beside its results (empty for a full one)."""
    if limit is None:
        return ""
    part = f"{limit:g} of each task's documents" if limit >= 1 else f"a fraction {limit:g} of each task's documents"
    return (f"--limit: scored {part} only, so these scores are not comparable with a full evaluation's "
            f"({RESULTS_NAME}, which this run leaves as it was)")
TASK_DIR_NAME = "harness_tasks"  # the local tasks' YAML files, written beside the results


def check_max_length_value(value) -> None:
    """A nonsense --max-length fails before anything loads."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 2):
        raise UserError(f"--max-length {value!r} must be an integer of at least 2 tokens (default: the "
                        "checkpoint's training seq-length)")


def resolve_max_length(value: int | None, model, cfg) -> int:
    """--max-length, default the training length; longer is allowed (our schemes extrapolate) up to
    what the positional scheme can represent (learned absolute positions: max-position-embeddings)."""
    check_max_length_value(value)
    length = cfg.model.seq_length if value is None else value
    limit = model.position.max_length()
    if limit and length > limit:
        raise UserError(f"--max-length {length}: pos-emb {cfg.model.pos_emb} represents at most {limit} positions "
                        f"(max-position-embeddings); pass --max-length {limit} or less")
    return length


def metrics_of(results: dict) -> dict[str, float]:
    """{'task/metric': value} of the harness's results, its metrics only (those in its
    higher_is_better table); a filter other than 'none' keeps its name."""
    out = {}
    for task, row in results.get("results", {}).items():
        known = results.get("higher_is_better", {}).get(task, {})
        for key, value in row.items():
            metric, _, filt = key.partition(",")
            if metric not in known or not isinstance(value, (int, float)):
                continue
            out[f"{task}/{metric}" + (f"/{filt}" if filt and filt != "none" else "")] = float(value)
    return out


def log_scores(cfg, iteration: int | None, metrics: dict[str, float]) -> None:
    """To TensorBoard / W&B (and metrics.jsonl) through the training's metrics logger, when the
    checkpoint's config turns them on and its run directory is here (a checkpoint copied from
    elsewhere must not create a stray run directory under the current one)."""
    lg = cfg.logging
    if not (tensorboard_dir(lg) or (lg.use_wandb and lg.wandb_mode != "disabled")):
        return
    if not os.path.isdir(lg.run_dir):
        print(f"harness scores not logged to TensorBoard/W&B: the checkpoint's run-dir {lg.run_dir!r} is not here")
        return
    logger = MetricsLogger(cfg, lg.run_dir)
    try:
        logger.log_eval(iteration or 0, "harness", metrics, f"iteration {iteration}", console=False)  # the table says it
    finally:
        logger.close()


RESULT_KEYS = ("results", "groups", "versions", "n-shot", "higher_is_better", "n-samples")


def merge_results(into: dict, other: dict) -> None:
    """Two of the harness's results (the RULER tasks run in an evaluation of their own) as one:
    its table and our record read only these keys, each keyed by task."""
    for key in RESULT_KEYS:
        if key in other:
            into.setdefault(key, {}).update(other[key])


def write_results(record: dict, path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_output(path, fsync=False) as tmp, open(tmp, "w") as f:
        json.dump(record, f, indent=1, default=str)  # task configs hold functions: their names
    return path


def evaluate_tasks(ckpt: str, tasks: list[str], out_dir: str, *, tag=None, overrides=None, max_length=None,
                   batch_size: int = 1, limit=None, num_fewshot=None, device="auto", allow_nonfinite=False,
                   results_path: str | None = None, log: bool = True, include_paths=(),
                   bootstrap_iters: int | None = None, overwrite: bool = True,
                   ruler_lengths: list[int] | None = None) -> dict:
    """Everything one checkpoint needs; returns the results record (also written to results_path,
    default <out_dir>/harness.json, harness_limitN.json with a `limit` (results_name), which an
    earlier evaluation's is only replaced with `overwrite`; the dated prefix files are not checked).
    Inputs are checked before the model loads where they can be. RULER tasks (ruler.py) run at
    `ruler_lengths` in an evaluation of their own, their results merged into the same record."""
    check_max_length_value(max_length)
    if batch_size < 1:
        raise UserError(f"--batch-size {batch_size} must be at least 1")
    if bootstrap_iters is not None and bootstrap_iters < 0:
        raise UserError(f"--bootstrap-iters {bootstrap_iters} must be 0 (no stderr) or more")
    ruler_names, tasks = ruler.split_tasks(tasks)
    ruler.refuse_unavailable(ruler_names)
    ruler.check_lengths(ruler_lengths, ruler_names, max_length)
    names = []
    if tasks:
        manager = task_manager(tasks, os.path.join(out_dir, TASK_DIR_NAME), include_paths)
        names = check_tasks(tasks, manager, include_paths)
        check_task_docs(manager, names)
    else:
        check_include_paths(include_paths)
    if results_path is None:
        refuse_earlier_results(out_dir, [results_name(limit)], overwrite)
    # lazy: pulls in torch (the model); the task refusals above need none
    from megatron.checkpoint.load_model import load_checkpoint_model

    model, cfg, client = load_checkpoint_model(ckpt, tag, overrides, device, allow_nonfinite)
    length = resolve_max_length(max_length, model, cfg)
    d = cfg.data
    tokenizer = build_tokenizer(d.tokenizer_type, d.vocab_file, d.merge_file)
    start = time.perf_counter()
    prepared = ruler.prepare(ruler_names, ruler_lengths, max_length, model, cfg, tokenizer, out_dir, limit) \
        if ruler_names else None
    # lazy: lm-eval's evaluator and our adapter (torch): evaluate.py's --max-length check imports this module
    import lm_eval
    from lm_eval.evaluator import simple_evaluate
    from lm_eval.utils import make_table

    from megatron.evaluation.harness.adapter import KerpleLM

    if bootstrap_iters is None:  # the harness's own default: its stderr, not a cheaper estimate
        bootstrap_iters = inspect.signature(simple_evaluate).parameters["bootstrap_iters"].default
    common = dict(num_fewshot=num_fewshot, log_samples=False, bootstrap_iters=bootstrap_iters,
                  random_seed=cfg.training.seed)
    results = {}
    if names:
        lm = KerpleLM(model, tokenizer, length, batch_size, seed=cfg.training.seed)
        results = simple_evaluate(lm, tasks=names, limit=limit, task_manager=manager, **common)
    if prepared is not None:
        lm = KerpleLM(model, tokenizer, prepared.max_length, batch_size, seed=cfg.training.seed)
        merge_results(results, ruler.evaluate(lm, prepared, **common))
        if not names:  # RULER only: its context is the run's
            length = prepared.max_length
    iteration = client.get("iteration")
    record = {
        "schema": SCHEMA, "checkpoint": os.path.abspath(ckpt), "iteration": iteration,
        "pos_emb": cfg.model.pos_emb, "train_length": cfg.model.seq_length, "max_length": length,
        "batch_size": batch_size, "limit": limit, "num_fewshot": num_fewshot, "device": str(device),
        "bootstrap_iters": bootstrap_iters, "include_paths": check_include_paths(include_paths),
        "tasks": names + ruler_names,
        "lm_eval_version": lm_eval.__version__ if hasattr(lm_eval, "__version__") else None,
        "seconds": round(time.perf_counter() - start, 2), "metrics": metrics_of(results),
        **{k: results[k] for k in RESULT_KEYS if k in results},
    }
    if prepared is not None:
        record["ruler"] = ruler.summary(results, prepared)
    path = write_results(record, results_path or os.path.join(out_dir, results_name(limit)))
    if log:
        log_scores(cfg, iteration, record["metrics"])
    ruler_note = "" if prepared is None else f"; RULER at {','.join(map(str, prepared.lengths))} tokens" + \
        (f" with max-length {prepared.max_length}" if names else "")
    print(f"max-length {length} (training length {cfg.model.seq_length}){ruler_note}, pos-emb {cfg.model.pos_emb}, "
          f"checkpoint {ckpt} iteration {iteration}")
    print(make_table(results))
    if "groups" in results:
        print(make_table(results, "groups"))
    if prepared is not None:
        print(ruler.mean_line(record["ruler"]))
    print(f"wrote {path}" + (f"; {limit_note(limit)}" if limit is not None else ""))
    return record
