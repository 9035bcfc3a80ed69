#!/usr/bin/env python
"""Merge a tensor-parallel checkpoint (mp_rank_00 .. mp_rank_XX) into a TP=1 checkpoint: `python
tools/merge_tp_checkpoint.py --help`; the tool is megatron/checkpoint/merge_command.py."""
from megatron.checkpoint.merge_command import main
from megatron.errors import run_cli

if __name__ == "__main__":
    run_cli(main, "merge_tp_checkpoint.py", expected=(ValueError,))
