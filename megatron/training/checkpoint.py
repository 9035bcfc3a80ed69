"""Checkpoints in the NeoX/DeepSpeed layout:

    <dir>/latest                                  text: the tag of the newest COMPLETE checkpoint
    <dir>/global_step<N>/mp_rank_00_model_states.pt  module + optimizer + lr_scheduler + client state
    <dir>/global_step<N>/configs/<each yml>       the user's original config files (as NeoX)
    <dir>/global_step<N>/resolved_config.yml      the validated, resolved config

A save is atomic from the reader's side: DeepSpeed writes `global_step<N>.incomplete/`, we add
the configs, rename it to `global_step<N>/` (an atomic rename), and only then replace `latest`
(temp file, fsync, os.replace; checkpoint_latest.py). A crash at any point leaves `latest` naming
the previous complete checkpoint; leftover `*.incomplete` directories are removed by the next save,
a leftover `latest.tmp<pid>` by the next save or start. A write that fails (disk full) raises
CheckpointSaveError saying so, where, and which step `latest` still names.

Loading reads `latest` once per load and only accepts a plain tag inside the directory
(checkpoint_latest.py); every file, ours included, is read with weights_only=True and an allow-list
(megatron/interop/safe_load.py; DeepSpeed's reads go through checkpoint_engine.py) and refused when
it holds NaN/inf (checkpoint_finite.py) unless allowed.
"""
from __future__ import annotations

import errno
import glob
import os
import random
import re
import shutil

import numpy as np
import torch

from megatron.atomic_io import fsync_path
from megatron.errors import EXIT_SYSTEM_ERROR, UserError
from megatron.training.checkpoint_latest import (  # noqa: F401 - read_latest/tag_for are used by importers
    LATEST,
    clean_stale_tmp,
    read_latest,
    resolve_tag,
    tag_for,
    write_latest,
)

# Model-shape arguments NeoX asserts equal on load (check_checkpoint_args), plus the scheme.
CHECKED_ARGS = ("num_layers", "hidden_size", "num_attention_heads", "pos_emb")


INCOMPLETE = ".incomplete"  # suffix of a tag directory that is still being written


class CheckpointError(UserError):
    pass


class CheckpointSaveError(CheckpointError):
    """A save that could not be written (disk full, I/O error): the machine, not the input."""

    exit_code = EXIT_SYSTEM_ERROR


def model_args(cfg, padded_vocab_size: int) -> dict:
    args = {k: getattr(cfg.model, k) for k in CHECKED_ARGS}
    args["max_position_embeddings"] = cfg.model.max_position_embeddings
    args["padded_vocab_size"] = padded_vocab_size
    args["model_parallel_size"] = cfg.parallel.model_parallel_size
    args["make_vocab_size_divisible_by"] = cfg.model.make_vocab_size_divisible_by
    args["tokenizer_type"] = cfg.data.tokenizer_type
    return args


def rng_state() -> dict:
    state = {
        "random_rng_state": random.getstate(),
        "np_rng_state": np.random.get_state(),
        "torch_rng_state": torch.get_rng_state(),
    }
    if torch.cuda.is_available():  # dropout on GPU draws from the CUDA generator (NeoX's key)
        state["cuda_rng_state"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["random_rng_state"])
    np.random.set_state(state["np_rng_state"])
    torch.set_rng_state(state["torch_rng_state"])
    if "cuda_rng_state" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda_rng_state"])


class Checkpointer:
    """Saves and restores a DeepSpeed engine plus our client state (iteration, RNG, config)."""

    def __init__(self, cfg, padded_vocab_size: int, is_rank0: bool = True):
        self.cfg = cfg
        self.ccfg = cfg.checkpoint
        self.args = model_args(cfg, padded_vocab_size)
        self.is_rank0 = is_rank0
        if is_rank0 and self.ccfg.save:
            clean_stale_tmp(self.ccfg.save)  # a `latest.tmp<pid>` left by a killed writer

    def should_save(self, iteration: int) -> bool:
        c = self.ccfg
        if not c.save:
            return False
        if c.extra_save_iters and iteration in c.extra_save_iters:
            return True
        if not c.interval:
            return False
        if c.checkpoint_scale == "log":  # powers of the interval: 1, f, f^2, ...
            k = 1
            while k < iteration:
                k *= c.interval
            return k == iteration
        return iteration % c.interval == 0

    def save(self, engine, iteration: int, extra_client_state: dict | None = None) -> str:
        """Write global_step<iteration> and point `latest` at it. A failed write (disk full) raises
        CheckpointSaveError on every rank after removing the partial directory; `latest` then still
        names the previous checkpoint."""
        save_dir, tag = self.ccfg.save, tag_for(iteration)
        staging = tag + INCOMPLETE
        client = {"iteration": iteration, "args": self.args, "config": self.cfg.to_flat_dict()}
        if not self.ccfg.no_save_rng:
            client.update(rng_state())
        client.update(extra_client_state or {})
        if self.is_rank0:
            clean_stale_tmp(save_dir)
            shutil.rmtree(os.path.join(save_dir, staging), ignore_errors=True)
        _barrier()
        failure = _attempt(lambda: engine.save_checkpoint(save_dir, tag=staging, client_state=client,
                                                          save_latest=False))
        # every rank's files are written (or every rank learns that one failed) before publishing
        self._raise_if_failed(failure, save_dir, tag)
        if self.is_rank0:
            failure = _attempt(lambda: self._publish(save_dir, staging, tag))
        self._raise_if_failed(failure, save_dir, tag)
        return os.path.join(save_dir, tag)

    def _publish(self, save_dir: str, staging: str, tag: str) -> None:
        self._write_configs(os.path.join(save_dir, staging))
        final = os.path.join(save_dir, tag)
        if os.path.isdir(final):  # re-saving a step (never the one `latest` would lose)
            shutil.rmtree(final)
        os.replace(os.path.join(save_dir, staging), final)
        fsync_path(save_dir)  # the rename is durable before `latest` can name it
        write_latest(save_dir, tag)
        self._prune(save_dir)

    def _raise_if_failed(self, failure: BaseException | None, save_dir: str, tag: str) -> None:
        if _all_ranks_ok(failure is None):
            return
        if failure is not None and not _is_write_failure(failure):
            raise failure  # a bug, not the disk: keep its traceback
        free = _free_bytes(save_dir)  # before the partial directory is removed and frees its space
        if self.is_rank0:
            shutil.rmtree(os.path.join(save_dir, tag + INCOMPLETE), ignore_errors=True)
        raise CheckpointSaveError(save_failure_message(save_dir, tag, failure, free)) from failure

    def _write_configs(self, tag_dir: str) -> None:
        os.makedirs(os.path.join(tag_dir, "configs"), exist_ok=True)
        for name, text in self.cfg.config_files.items():
            with open(os.path.join(tag_dir, "configs", name), "w") as f:
                f.write(text)
        self.cfg.save(os.path.join(tag_dir, "resolved_config.yml"))

    def _prune(self, save_dir: str) -> None:
        """Drop leftovers of interrupted saves, then all but the newest keep_last_n checkpoints."""
        latest = read_latest(save_dir)
        for d in os.listdir(save_dir):
            if d.endswith(INCOMPLETE):
                shutil.rmtree(os.path.join(save_dir, d), ignore_errors=True)
        keep = self.ccfg.keep_last_n_checkpoints
        if not keep:
            return
        steps = sorted(
            int(m.group(1)) for d in os.listdir(save_dir) if (m := re.fullmatch(r"global_step(\d+)", d))
        )
        for step in steps[:-keep]:
            if tag_for(step) != latest:
                shutil.rmtree(os.path.join(save_dir, tag_for(step)), ignore_errors=True)

    def load(self, engine) -> dict | None:
        """Restore the engine from `load`; returns the client state, or None for a fresh start."""
        c = self.ccfg
        if not c.load:
            return None
        from megatron.interop.neox_layout import foreign_layout

        # `latest` is read once (and validated): every later read uses this tag
        tag = resolve_tag(c.load, tag_for(c.iteration)) if c.iteration is not None else read_latest(c.load)
        if tag is None:
            print(f"[checkpoint] no `latest` in {c.load!r}: starting from scratch", flush=True)
            return None
        if foreign_layout(c.load, tag):
            return self._load_foreign(engine, tag)
        if not os.path.isdir(os.path.join(c.load, tag)):
            raise CheckpointError(f"checkpoint {os.path.join(c.load, tag)} does not exist (iteration: {c.iteration})")
        path, client = self._engine_load(engine, tag)
        if path is None:
            raise CheckpointError(f"DeepSpeed could not load {os.path.join(c.load, tag)}")
        self._check_args(client.get("args", {}), os.path.join(c.load, tag))
        if not (c.no_load_rng or c.finetune) and "torch_rng_state" in client:
            set_rng_state(client)
        print(f"[checkpoint] loaded {path} (iteration {client.get('iteration')})", flush=True)
        if c.finetune:
            client["iteration"] = 0
        return client

    def _engine_load(self, engine, tag: str):
        """engine.load_checkpoint with every file read by the safe reader (checkpoint_engine.py)."""
        from megatron.interop.safe_load import TRUST_HINT, trusted_from_env
        from megatron.training.checkpoint_engine import install_safe_loading, safe_zero_to_fp32

        c = self.ccfg
        trust = trusted_from_env()
        if engine.load_universal_checkpoint() and not trust:
            raise CheckpointError(f"load: {c.load!r}: DeepSpeed reads universal checkpoints with its own full "
                                  f"(code-executing) unpickler, which safe loading cannot check; {TRUST_HINT}")
        tag_dir = os.path.join(c.load, tag)
        install_safe_loading(engine, trust, c.allow_nonfinite_weights, tag_dir)
        load_optim = not (c.no_load_optim or c.finetune)
        with safe_zero_to_fp32(trust, c.allow_nonfinite_weights, tag_dir):
            return engine.load_checkpoint(
                c.load, tag=tag,
                load_optimizer_states=load_optim,
                load_lr_scheduler_states=load_optim,
                load_module_strict=True,
            )

    def _load_foreign(self, engine, tag: str) -> dict:
        """A NeoX / KERPLE checkpoint: module weights only (its optimizer state is DeepSpeed's
        from another codebase), as a fine-tune start at iteration 0."""
        from megatron.interop.neox_checkpoint import read_neox_checkpoint
        from megatron.interop.safe_load import trusted_from_env

        c = self.ccfg
        if self.cfg.parallel.model_parallel_size > 1 or self.cfg.parallel.pipe_parallel_size >= 1:
            raise CheckpointError(f"load: {c.load!r} is a NeoX checkpoint; convert it first with "
                                  "tools/convert_neox_checkpoint.py, or train it with model-parallel-size 1 "
                                  "and pipe-parallel-size 0")
        module = engine.module
        dtype = next(module.parameters()).dtype
        ck = read_neox_checkpoint(c.load, tag, trust=trusted_from_env(), dtype=dtype,
                                  allow_nonfinite=c.allow_nonfinite_weights)
        self._check_args({k: getattr(ck.cfg.model, k) for k in CHECKED_ARGS}
                         | {"padded_vocab_size": ck.vocab_size}, ck.tag_dir)
        module.load_state_dict(ck.state, strict=True)
        if hasattr(engine.optimizer, "refresh_fp32_params"):  # bf16 / ZeRO keep fp32 master copies
            engine.optimizer.refresh_fp32_params()
        print(f"[checkpoint] loaded the module weights only of {ck.tag_dir} (no optimizer, LR schedule, "
              "RNG or data position): training starts at iteration 0", flush=True)
        return {"iteration": 0}

    def _check_args(self, saved: dict, where: str) -> None:
        bad = [f"{k}: checkpoint {saved[k]!r} != config {self.args[k]!r}"
               for k in CHECKED_ARGS + ("padded_vocab_size",) if k in saved and saved[k] != self.args[k]]
        if bad:
            raise CheckpointError(f"checkpoint {where} does not match the config: " + "; ".join(bad))


def _barrier() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()


def _attempt(fn) -> BaseException | None:
    """Run fn; the exception it raised (None on success), so every rank can agree before raising."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - _raise_if_failed re-raises anything that is not a write failure
        return e
    return None


def _all_ranks_ok(ok: bool) -> bool:
    """True when `ok` on every rank (a barrier that also carries one bit: did anyone fail?)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return ok
    device = "cuda" if torch.distributed.get_backend() == "nccl" else "cpu"
    flag = torch.tensor([1 if ok else 0], device=device)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
    return bool(flag.item())


# torch.save's C++ writer reports a failed write (ENOSPC included) as a RuntimeError with these words
_WRITE_FAILURE = ("iostream error", "PytorchStreamWriter", "inline_container", "file write failed", "unexpected pos")


def _is_write_failure(e: BaseException | None) -> bool:
    """OSError, or torch.save's RuntimeError for a failed write; None: another rank failed."""
    if e is None or isinstance(e, OSError):
        return True
    return isinstance(e, RuntimeError) and any(w in str(e) for w in _WRITE_FAILURE)


def _free_bytes(path: str) -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


DISK_FULL_BYTES = 64 << 20  # less than this free after a failed write: call it a full disk


def describe_write_failure(error: BaseException | None, free: int | None) -> str:
    """'the disk is full (<error>; 3 MiB free there)' or 'writing failed (...)'."""
    full = (getattr(error, "errno", None) == errno.ENOSPC) or (free is not None and free < DISK_FULL_BYTES)
    detail = " ".join(str(error).split())[:200] if error is not None else "it failed on another rank"
    left = f"{free / 2**20:.0f} MiB free there" if free is not None else "free space unknown"
    return f"{'the disk is full' if full else 'writing failed'} ({detail}; {left})"


def save_failure_message(save_dir: str, tag: str, error: BaseException | None, free: int | None) -> str:
    """What failed, where, what `latest` still names, and the fix."""
    try:
        previous = read_latest(save_dir)
    except CheckpointError:
        previous = None
    kept = (f"{os.path.join(save_dir, LATEST)} still names {previous}, the last complete checkpoint"
            if previous else f"there is no earlier complete checkpoint in {save_dir}")
    return (f"could not save checkpoint {tag} into {save_dir}: {describe_write_failure(error, free)}; {kept}, and the "
            f"partial {tag}{INCOMPLETE} was removed. Free space there (or set `save:` to another directory) "
            f"and resume with `load:`")


def torch_save_file(obj, path: str) -> None:
    """torch.save for the tools that write checkpoints (merge, convert): a failed write (disk full)
    becomes CheckpointSaveError naming the file; the partial file is removed. They write `latest`
    last, so it is unchanged."""
    try:
        torch.save(obj, path)
    except (OSError, RuntimeError) as e:
        if not _is_write_failure(e):
            raise
        free = _free_bytes(os.path.dirname(path) or ".")
        if os.path.exists(path):
            os.remove(path)
        raise CheckpointSaveError(f"could not write {path}: {describe_write_failure(e, free)}; `latest` next to "
                                  "it was not changed. Free space there or choose another --output") from e


def load_model_state(ckpt_dir: str, tag: str | None = None,
                     allow_nonfinite: bool = False) -> tuple[dict, dict, str]:
    """Read the module weights and client state of one checkpoint without an engine (evaluate.py).
    Every file is read by the safe reader (megatron/interop/safe_load.py) and checked for NaN/inf.

    Returns (state_dict, client_state, tag_dir)."""
    from megatron.interop.safe_load import read_checkpoint_file

    tag = resolve_tag(ckpt_dir, tag)
    tag_dir = os.path.join(ckpt_dir, tag)

    def read(p: str) -> dict:
        return read_checkpoint_file(p, allow_nonfinite=allow_nonfinite)

    path = os.path.join(tag_dir, "mp_rank_00_model_states.pt")
    zero3 = sorted(glob.glob(os.path.join(tag_dir, "*zero_pp_rank_*_mp_rank_00_model_states.pt")))
    if zero3 and not os.path.isfile(path):  # ZeRO-3: weights are partitioned over the optimizer files
        return _load_zero3(ckpt_dir, tag, zero3[0], allow_nonfinite)
    if not os.path.isfile(path):
        raise CheckpointError(f"{path} is missing: {tag_dir} is not a complete sequential checkpoint")
    from megatron.parallel.merge_checkpoint import load_merged, shard_files
    from megatron.parallel.pipeline_merge import merge_pipeline_to_sequential

    if glob.glob(os.path.join(tag_dir, "layer_*-model_states.pt")):  # pipeline engine: weights in layer files
        client = _client_state(read(path))
        print(f"[checkpoint] read pipeline layer files of {tag_dir} into the sequential model", flush=True)
        return merge_pipeline_to_sequential(tag_dir, read), client, tag_dir
    shards = shard_files(tag_dir)
    if len(shards) > 1:  # saved with tensor parallelism: merge to TP=1 in memory
        module, client = load_merged(shards, read)
        return module, client, tag_dir
    blob = read(path)
    return blob["module"], _client_state(blob), tag_dir


def _client_state(blob: dict) -> dict:
    return {k: v for k, v in blob.items() if k not in ("module", "optimizer")}


def _load_zero3(ckpt_dir: str, tag: str, first_model_file: str,
                allow_nonfinite: bool = False) -> tuple[dict, dict, str]:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    from megatron.interop.safe_load import read_checkpoint_file
    from megatron.training.checkpoint_engine import safe_zero_to_fp32

    client = _client_state(read_checkpoint_file(first_model_file, allow_nonfinite=allow_nonfinite))
    print(f"[checkpoint] consolidated the ZeRO-3 partitions of {os.path.join(ckpt_dir, tag)}", flush=True)
    try:
        with safe_zero_to_fp32(allow_nonfinite=allow_nonfinite, tag_dir=os.path.join(ckpt_dir, tag)):
            state = get_fp32_state_dict_from_zero_checkpoint(ckpt_dir, tag=tag)
    except UserError:  # refused by the safe reader (unsafe, non-finite, missing): its message names the file
        raise
    except Exception as e:  # a missing or truncated optimizer partition
        raise CheckpointError(f"could not consolidate ZeRO-3 checkpoint {os.path.join(ckpt_dir, tag)}: {e}") from e
    return dict(state), client, os.path.join(ckpt_dir, tag)
