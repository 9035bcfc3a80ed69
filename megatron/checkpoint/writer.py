"""The one TP=1 checkpoint writer (tools/merge_tp_checkpoint.py, tools/convert_neox_checkpoint.py),
and the words for a failed write (shared with training's Checkpointer):

    <out>/latest                                     the whole <out> is published at once (temp dir + rename)
    <out>/global_stepN/mp_rank_00_model_states.pt    {module, optimizer: None, client state}
    <out>/global_stepN/resolved_config.yml           the config as read, TP=1
    <out>/global_stepN/configs/<original yml>
    <out>/global_stepN/manifest.json                 every file's size and hash, written last (manifest.py)

The result is a TP=1 checkpoint in our own layout that evaluate.py, generate.py,
tools/export_hf.py and `load:` (with finetune: true, as it holds no optimizer state) read.
"""
from __future__ import annotations

import errno
import glob
import os
import shutil

import torch

from megatron.atomic_io import atomic_directory
from megatron.checkpoint.client import model_args
from megatron.checkpoint.errors import CheckpointSaveError
from megatron.checkpoint.layout import CONFIGS_DIR, MODEL_FILE, RESOLVED_CONFIG, is_neox
from megatron.checkpoint.manifest import model_keys, write_manifest
from megatron.checkpoint.output import check_output
from megatron.checkpoint.safe_load import read_checkpoint_file
from megatron.checkpoint.tags import write_latest

# torch.save's C++ writer reports a failed write (ENOSPC included) as a RuntimeError with these words
_WRITE_FAILURE = ("iostream error", "PytorchStreamWriter", "inline_container", "file write failed", "unexpected pos")
DISK_FULL_BYTES = 64 << 20
# what write_checkpoint writes: one process's file, weights only
TP1_LAYOUT = {"model_parallel_size": 1, "pipe_parallel_size": 0, "data_parallel_size": 1, "zero_stage": 0,
              "world_size": 1}  # less than this free after a failed write: call it a full disk


def is_write_failure(e: BaseException | None) -> bool:
    """OSError, or torch.save's RuntimeError for a failed write; None: another rank failed."""
    if e is None or isinstance(e, OSError):
        return True
    return isinstance(e, RuntimeError) and any(w in str(e) for w in _WRITE_FAILURE)


def free_bytes(path: str) -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def describe_write_failure(error: BaseException | None, free: int | None) -> str:
    """'the disk is full (<error>; 3 MiB free there)' or 'writing failed (...)'."""
    full = (getattr(error, "errno", None) == errno.ENOSPC) or (free is not None and free < DISK_FULL_BYTES)
    detail = " ".join(str(error).split())[:200] if error is not None else "it failed on another rank"
    left = f"{free / 2**20:.0f} MiB free there" if free is not None else "free space unknown"
    return f"{'the disk is full' if full else 'writing failed'} ({detail}; {left})"


def torch_save_file(obj, path: str) -> None:
    """torch.save for the tools that write checkpoints: a failed write (disk full) becomes
    CheckpointSaveError naming the file; the partial file is removed. `latest` is written last,
    so it is unchanged."""
    try:
        torch.save(obj, path)
    except (OSError, RuntimeError) as e:
        if not is_write_failure(e):
            raise
        free = free_bytes(os.path.dirname(path) or ".")
        if os.path.exists(path):
            os.remove(path)
        raise CheckpointSaveError(f"could not write {path}: {describe_write_failure(e, free)}; `latest` next to "
                                  "it was not changed. Free space there or choose another --output") from e


def holds_optimizer_state(tag_dir: str, trust: bool = False) -> bool:
    """False for a weights-only step (what write_tp1_checkpoint writes: `optimizer` None and no
    ZeRO optimizer partitions). Reads the model file: call it on a failure path only."""
    if glob.glob(os.path.join(tag_dir, "*optim_states.pt")):
        return True
    path = os.path.join(tag_dir, MODEL_FILE)
    return os.path.isfile(path) and read_checkpoint_file(path, trust, allow_nonfinite=True).get("optimizer") is not None


def write_tp1_checkpoint(ck, output_dir: str, overwrite: bool = False) -> str:
    """Write `ck` (a reader.Tp1Checkpoint) as a TP=1 checkpoint in our layout, the whole of
    output_dir (`latest` + the step, same tag), published at once (atomic_directory); an existing
    output_dir is replaced only with overwrite. Returns the written step directory. A NeoX source
    gets our client state (model args, config, where it came from); ours keeps its own (already
    saying TP=1)."""
    tag = os.path.basename(os.path.normpath(ck.tag_dir))
    if is_neox(ck.layout):
        client = {"iteration": ck.client.get("iteration", 0), "args": model_args(ck.cfg, ck.vocab_size),
                  "config": ck.cfg.to_flat_dict(), "converted_from": os.path.abspath(ck.tag_dir),
                  "source_layout": ck.layout}
        header = f"converted from {ck.tag_dir} ({ck.layout})"
    else:
        client, header = ck.client, f"merged to TP=1 from {ck.tag_dir}"
    configs = os.path.join(ck.tag_dir, CONFIGS_DIR)
    return write_checkpoint(ck.state, client, ck.cfg, output_dir, tag, overwrite, header,
                            os.path.dirname(os.path.normpath(ck.tag_dir)), configs if os.path.isdir(configs) else None)


def write_checkpoint(state: dict, client: dict, cfg, output_dir: str, tag: str, overwrite: bool, header: str,
                     input_dir: str | None, configs_dir: str | None = None, extra_files: dict | None = None) -> str:
    """The TP=1 checkpoint `output_dir` (`latest` + `tag`), published at once; `input_dir` is what
    was read (never written into); `configs_dir`: original YAML files to copy beside it;
    `extra_files`: {name under output_dir: source path} copied too (an imported model's tokenizer)."""
    check_output(output_dir, overwrite, input_dir)
    os.makedirs(os.path.dirname(os.path.abspath(output_dir)), exist_ok=True)
    with atomic_directory(output_dir) as tmp:
        out = os.path.join(tmp, tag)
        os.makedirs(out)
        torch_save_file({**client, "module": state, "optimizer": None}, os.path.join(out, MODEL_FILE))
        if configs_dir is not None:
            shutil.copytree(configs_dir, os.path.join(out, CONFIGS_DIR))
        for name, src in (extra_files or {}).items():
            os.makedirs(os.path.dirname(os.path.join(tmp, name)), exist_ok=True)
            shutil.copy(src, os.path.join(tmp, name))
        if cfg is not None:
            cfg.save(os.path.join(out, RESOLVED_CONFIG), header=header)
        model = model_keys(cfg) if cfg is not None else None
        write_manifest(out, tag, TP1_LAYOUT, model, client.get("iteration"))  # last, before `latest`
        write_latest(tmp, tag)
    return os.path.join(output_dir, tag)
