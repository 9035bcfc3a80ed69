#!/usr/bin/env python
"""Downstream tasks (lm-evaluation-harness) on the checkpoint a config's `load` names, as in
GPT-NeoX:

    python deepy.py eval.py configs/quickstart.yml --eval_tasks kerple_local
    python deepy.py eval.py CONFIG.yml --eval_tasks lambada_openai hellaswag --max-length 2048
    python deepy.py eval.py CONFIG.yml --eval_tasks niah_single_1 ruler_vt --ruler-lengths 1024,2048   # RULER
    python eval.py --resolved-config RUN/eval/resolved_config.yml --eval_tasks kerple_local   # what deepy.py runs

The model is built from the checkpoint's own config (the weights must match it); CONFIG supplies
`load` (else `save`, where its training wrote) and `iteration`. Results go to <load>/../eval/harness.json (beside evaluate.py's
perplexity results), or <prefix>_eval_results_<date>.json with --eval_results_prefix, and to
TensorBoard/W&B when the checkpoint's config turns them on; --limit N writes harness_limitN.json instead
(not comparable with a full run, so never in the full one's place). An earlier harness.json is kept (the
evaluation refused) unless --overwrite. See megatron/evaluation/harness/.
"""
import argparse

from megatron.checkpoint.tags import tag_or_latest
from megatron.checkpoint.trust import add_load_flags, apply_trust_flag
from megatron.cli_args import ArgumentParser
from megatron.device import add_device_flag, device_from_flag
from megatron.errors import UserError, run_cli
from megatron.evaluation.harness.cli import add_eval_flags, limit_value, progress_bars, results_path, ruler_lengths
from megatron.evaluation.harness.run import evaluate_tasks
from megatron.evaluation.outputs import check_output_dir, output_locks
from megatron.evaluation.report import default_output_dir
from megatron.launch.launcher import config_from_cli
from megatron.outputs_vs_inputs import refuse_overlap
from megatron.process.ranks import launch_ranks


def main() -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("conf_file", nargs="*", help="YAML config files merged in order")
    p.add_argument("--resolved-config", help="a resolved config written by deepy.py")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE")
    add_device_flag(p)
    p.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # set by launchers
    add_eval_flags(p, required=True)
    add_load_flags(p)
    args = p.parse_args()
    apply_trust_flag(args)
    world = launch_ranks().world_size
    if world > 1:  # torchrun, srun: each process would run every task into the same results file
        raise UserError(f"eval.py runs the lm-evaluation-harness in one process, but {world} were started "
                        "(WORLD_SIZE / SLURM_NTASKS): start it once (srun --ntasks 1); the perplexity sweep "
                        "is the evaluation spread over ranks (deepy.py evaluate.py CONFIG.yml)")
    cfg = config_from_cli(p, args)
    from megatron.checkpoint.load_model import config_checkpoint  # lazy: pulls in torch; a config refusal needs none

    load = config_checkpoint(cfg)  # its `load`, else `save` (where this config's training wrote)
    args.device = device_from_flag(args.device, "eval.py")
    out_dir, path = default_output_dir(load), results_path(args.eval_results_prefix)
    refuse_overlap("--eval_results_prefix", path, [("the checkpoint being evaluated (load)", load)])
    check_output_dir(out_dir)
    with output_locks([out_dir]), progress_bars(not args.quiet):
        evaluate_tasks(load, args.eval_tasks, out_dir, tag=tag_or_latest(cfg.checkpoint.iteration),
                       max_length=args.max_length, batch_size=args.batch_size, limit=limit_value(args.limit),
                       num_fewshot=args.num_fewshot, device=args.device, allow_nonfinite=args.allow_nonfinite,
                       results_path=path, include_paths=args.include_paths,
                       bootstrap_iters=args.bootstrap_iters, overwrite=args.overwrite,
                       ruler_lengths=ruler_lengths(args.ruler_lengths))
    return 0


if __name__ == "__main__":
    run_cli(main, "eval.py", expected=(ValueError,))  # tokenizer and checkpoint readers raise ValueErrors
