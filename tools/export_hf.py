#!/usr/bin/env python
"""Export a checkpoint (ours, or a NeoX/KERPLE one) as a Hugging Face model directory. A model a:
`python tools/export_hf.py --help`; the tool is megatron/interop/export_command.py."""
from megatron.errors import run_cli
from megatron.interop.export_command import main

if __name__ == "__main__":
    run_cli(main, "export_hf.py", expected=(ValueError,))
