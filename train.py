#!/usr/bin/env python
"""Train a model: `python train.py --resolved-config RUN/resolved_config.yml` (what deepy.py
passes) or directly `python train.py a.yml b.yml [-o KEY=VALUE ...]`. `--debug` shows the full
traceback of an expected failure (bad config, data, checkpoint, full disk, out of memory)."""
import argparse

from megatron.checkpoint.trust import add_trust_flag, apply_trust_flag
from megatron.cli_args import ArgumentParser
from megatron.config.inputs import check_inputs
from megatron.errors import run_cli
from megatron.launch.launcher import config_from_cli


def main() -> int:
    p = ArgumentParser(description=__doc__)
    p.add_argument("conf_file", nargs="*", help="YAML config files merged in order")
    p.add_argument("--resolved-config", help="a resolved config written by deepy.py")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # set by launchers
    add_trust_flag(p)  # for `load:`; allow-nonfinite-weights is a config key
    args = p.parse_args()
    apply_trust_flag(args)
    cfg = config_from_cli(p, args)
    check_inputs(cfg)  # every missing data/tokenizer/load path at once, before DeepSpeed starts
    from megatron.tokenizer import build_tokenizer  # lazy: as the trainer below (config refusals need neither)
    from megatron.training.data_setup import check_document_eod

    check_document_eod(cfg, build_tokenizer)  # the document keys' end-of-document token, before DeepSpeed starts
    from megatron.training.trainer import Trainer  # lazy: torch, DeepSpeed; config and input refusals need none

    # 130 after Ctrl-C (saved at a step boundary), 0 after pre-emption or the last iteration
    return Trainer(cfg, resolved_config=args.resolved_config).train().get("exit_code", 0)


if __name__ == "__main__":
    run_cli(main, "train.py", expected=(ValueError,))  # tokenizer, precision and data checks raise ValueErrors
