"""Write a NeoX / KERPLE checkpoint in our own layout (tools/convert_neox_checkpoint.py):

    <out>/latest
    <out>/global_stepN/mp_rank_00_model_states.pt   {module, optimizer: None, iteration, args, config}
    <out>/global_stepN/resolved_config.yml          the NeoX config as we read it (TP=1, no pipeline)
    <out>/global_stepN/configs/<original yml>

The result is a TP=1 sequential checkpoint that evaluate.py, generate.py, tools/export_hf.py and
`load:` (with finetune: true, as it holds no optimizer state) read like any of ours.
"""
from __future__ import annotations

import os
import shutil

import torch

from megatron.interop.neox_checkpoint import read_neox_checkpoint


def convert_neox_checkpoint(input_dir: str, output_dir: str, tag: str | None = None, config=None,
                            trust: bool = False, dtype: torch.dtype = torch.float32,
                            allow_nonfinite: bool = False) -> str:
    """Returns the written global_stepN directory."""
    from megatron.training.checkpoint import CheckpointError, model_args, torch_save_file
    from megatron.training.checkpoint_latest import write_latest

    ck = read_neox_checkpoint(input_dir, tag, config, trust=trust, dtype=dtype, allow_nonfinite=allow_nonfinite)
    step = os.path.basename(os.path.normpath(ck.tag_dir))
    out = os.path.join(output_dir, step)
    if os.path.abspath(out) == os.path.abspath(ck.tag_dir):
        raise CheckpointError("--output must differ from --input: the conversion never overwrites the source")
    os.makedirs(out, exist_ok=True)
    client = {"iteration": ck.client.get("iteration", 0), "args": model_args(ck.cfg, ck.vocab_size),
              "config": ck.cfg.to_flat_dict(), "converted_from": os.path.abspath(ck.tag_dir),
              "source_layout": ck.layout}
    torch_save_file({**client, "module": ck.state, "optimizer": None}, os.path.join(out, "mp_rank_00_model_states.pt"))
    if os.path.isdir(os.path.join(ck.tag_dir, "configs")):
        shutil.copytree(os.path.join(ck.tag_dir, "configs"), os.path.join(out, "configs"), dirs_exist_ok=True)
    ck.cfg.save(os.path.join(out, "resolved_config.yml"), header=f"converted from {ck.tag_dir} ({ck.layout})")
    write_latest(output_dir, step)  # last: never names a partial directory
    return out
