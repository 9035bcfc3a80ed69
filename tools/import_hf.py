#!/usr/bin/env python
"""Import a released Hugging Face model (Pythia / GPT-NeoX-20B, Llama, Mistral, as transformers':
`python tools/import_hf.py --help`; the tool is megatron/interop/import_command.py."""
from megatron.errors import run_cli
from megatron.interop.import_command import main

if __name__ == "__main__":
    run_cli(main, "import_hf.py")
