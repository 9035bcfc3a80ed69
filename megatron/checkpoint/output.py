"""The output directory of a tool that writes a whole checkpoint (tools/merge_tp_checkpoint.py,
tools/convert_neox_checkpoint.py), checked before any checkpoint is read. No torch here: a refusal
is answered before torch loads.
"""
from __future__ import annotations

import os

from megatron.atomic_io import refuse_existing_output
from megatron.checkpoint.errors import CheckpointError
from megatron.checkpoint.tags import describe_steps, read_latest, steps_in
from megatron.outputs_vs_inputs import refuse_overlap


def check_output(output_dir: str, overwrite: bool, input_dir: str | None = None,
                 input_is: str = "the checkpoint being read (--input)") -> None:
    """Before any reading: --output stays clear of the input (`input_is`, at input_dir: the rule of
    megatron/outputs_vs_inputs.py, for a directory replaced whole), and an existing one (another
    run's checkpoints: replacing a step would drop its optimizer state and move `latest`
    backwards) is replaced only with --overwrite."""
    refuse_overlap("--output", output_dir, [(input_is, input_dir)], replaced_whole=True)
    steps = steps_in(output_dir) if os.path.isdir(output_dir) else []
    try:
        latest = read_latest(output_dir) if steps else None
    except CheckpointError:  # a damaged `latest`: the steps are still worth naming
        latest = None
    what = (f"checkpoints {describe_steps(steps)}" + (f" (`latest` names {latest})" if latest else "")
            + ": the whole directory would be replaced by the one written now") if steps else ""
    refuse_existing_output(output_dir, overwrite, "--output", what)
