#!/usr/bin/env python
"""Launch training the NeoX way: `python deepy.py train.py a.yml b.yml` (see megatron/launch/launcher.py)."""
from megatron.errors import run_cli
from megatron.launch.launcher import main

if __name__ == "__main__":
    run_cli(main, "deepy.py", expected=(ValueError,))  # --dry-run reads the tokenizer, whose errors are ValueErrors
