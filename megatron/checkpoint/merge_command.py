"""Merge a tensor-parallel checkpoint (mp_rank_00 .. mp_rank_XX) into a TP=1 checkpoint.

    python tools/merge_tp_checkpoint.py --input runs/x/checkpoints --output runs/x/merged [--iteration N]

Writes <output>/latest, <output>/global_stepN/mp_rank_00_model_states.pt (module + client state
with model_parallel_size 1; no optimizer state), resolved_config.yml (model-parallel-size 1) and
configs/, all at once (a temporary directory renamed into place). An existing --output is
refused unless --overwrite, which replaces the whole directory: merging into a training run's own
checkpoint directory would otherwise replace a step without its optimizer state and move `latest`
backwards. evaluate.py also merges automatically in memory, so this is for keeping a TP=1 copy.
Any layout megatron/checkpoint/reader.py reads works as input (pipeline layer files, ZeRO-3 too).
"""
from __future__ import annotations

from megatron.checkpoint.output import check_output
from megatron.checkpoint.tags import resolve_tag, tag_or_latest
from megatron.checkpoint.trust import add_load_flags, apply_trust_flag
from megatron.cli_args import input_output_parser, int_at_least


def main(argv=None) -> int:
    p = input_output_parser(__doc__, "checkpoint directory holding `latest` and global_step<N>/",
                            "directory for the TP=1 checkpoint")
    p.add_argument("--iteration", type=int_at_least(0), default=None, help="merge global_step<N> instead of latest")
    add_load_flags(p)
    args = p.parse_args(argv)
    apply_trust_flag(args)

    resolve_tag(args.input, tag_or_latest(args.iteration))  # a missing checkpoint: answered before torch loads

    check_output(args.output, args.overwrite, args.input)  # and an existing output
    # lazy: pulls in torch: a missing checkpoint or a taken --output is refused above without it
    from megatron.checkpoint.reader import read_tp1_state
    from megatron.checkpoint.writer import write_tp1_checkpoint

    ck = read_tp1_state(args.input, tag_or_latest(args.iteration), allow_nonfinite=args.allow_nonfinite)
    out = write_tp1_checkpoint(ck, args.output, args.overwrite)
    print(f"[checkpoint] wrote TP=1 checkpoint {out}")
    return 0
