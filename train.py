#!/usr/bin/env python
"""Train a model: `python train.py --resolved-config RUN/resolved_config.yml` (what deepy.py
passes) or directly `python train.py a.yml b.yml [-o KEY=VALUE ...]`."""
import argparse
import sys

from megatron.config import ConfigError, NeoXConfig, load_config
from megatron.errors import run_cli
from megatron.launcher import parse_overrides


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("conf_file", nargs="*", help="YAML config files merged in order")
    p.add_argument("--resolved-config", help="a resolved config written by deepy.py")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # set by launchers
    args = p.parse_args()
    if bool(args.resolved_config) == bool(args.conf_file):
        p.error("give either config files or --resolved-config")
    try:
        if args.resolved_config:
            cfg = NeoXConfig.from_file(args.resolved_config)
        else:
            cfg = load_config(args.conf_file, overrides=parse_overrides(args.override))
    except ConfigError as e:
        print(f"train.py: invalid configuration\n{e}", file=sys.stderr)
        return 2
    from megatron.training.trainer import Trainer

    # 130 after Ctrl-C (saved at a step boundary), 0 after pre-emption or the last iteration
    return Trainer(cfg).train().get("exit_code", 0)


if __name__ == "__main__":
    run_cli(main, "train.py")
