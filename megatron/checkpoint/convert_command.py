"""Convert a NeoX / KERPLE checkpoint (2022 pipeline layer files or the current sequential
layout, any tensor-parallel degree, bf16/fp16/fp32) into this stack's TP=1 layout.

    python tools/convert_neox_checkpoint.py --input kerple_ckpts/ --output converted/
    python tools/convert_neox_checkpoint.py --input CKPT --output OUT --config my_neox.yml --iteration 50000
"""
from __future__ import annotations

from megatron.checkpoint.errors import CheckpointError
from megatron.checkpoint.layout import detect_layout, is_neox
from megatron.checkpoint.output import check_output
from megatron.checkpoint.tags import tag_dir_of, tag_or_latest
from megatron.checkpoint.trust import add_load_flags
from megatron.cli_args import input_output_parser, int_at_least
from megatron.config.precision import DTYPE_NAMES, torch_dtype
from megatron.outputs_vs_inputs import refuse_overlap


def main(argv=None) -> int:
    p = input_output_parser(__doc__, "NeoX checkpoint directory holding `latest` and global_step<N>/",
                            "where to write the converted checkpoint")
    p.add_argument("--iteration", type=int_at_least(0), default=None, help="convert global_step<N> instead of latest")
    p.add_argument("--config", nargs="+", default=None,
                   help="the NeoX YAML files (default: the checkpoint's global_step<N>/configs/*.yml)")
    p.add_argument("--dtype", choices=DTYPE_NAMES, default="fp32")
    add_load_flags(p)
    args = p.parse_args(argv)
    # lazy: pulls in torch: --help and flag errors need none
    from megatron.checkpoint.reader import read_tp1_state
    from megatron.checkpoint.writer import write_tp1_checkpoint

    check_output(args.output, args.overwrite, args.input)  # before the (long) read
    refuse_overlap("--output", args.output, [("a NeoX config being read (--config)", c) for c in args.config or []],
                   replaced_whole=True)
    dtype = torch_dtype(args.dtype)
    tag = tag_or_latest(args.iteration)
    tag_dir = tag_dir_of(args.input, tag)
    if not is_neox(detect_layout(tag_dir)):
        raise CheckpointError(f"{tag_dir} is in this stack's own layout, not NeoX's: it needs no conversion "
                              "(tools/merge_tp_checkpoint.py merges its tensor-parallel shards)")
    ck = read_tp1_state(args.input, tag, config=args.config, trust=args.trust_checkpoint, dtype=dtype,
                        allow_nonfinite=args.allow_nonfinite)
    out = write_tp1_checkpoint(ck, args.output, args.overwrite)
    print(f"wrote {out}")
    return 0
