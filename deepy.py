#!/usr/bin/env python
"""Launch training the NeoX way: `python deepy.py train.py a.yml b.yml` (see megatron/launcher.py)."""
import sys

from megatron.launcher import main

if __name__ == "__main__":
    sys.exit(main())
