"""Checkpoints in the NeoX/DeepSpeed layout:

    <dir>/latest                                  text: the tag of the newest COMPLETE checkpoint
    <dir>/global_step<N>/mp_rank_00_model_states.pt  module + optimizer + lr_scheduler + client state
    <dir>/global_step<N>/configs/<each yml>       the user's original config files (as NeoX)
    <dir>/global_step<N>/resolved_config.yml      the validated, resolved config

A save is atomic from the reader's side: DeepSpeed writes `global_step<N>.incomplete/`, we add
the configs, rename it to `global_step<N>/` (an atomic rename), and only then replace `latest`
(temp file, fsync, os.replace). A crash at any point leaves `latest` naming the previous complete
checkpoint; leftover `*.incomplete` directories are removed by the next save.
"""
from __future__ import annotations

import glob
import os
import random
import re
import shutil

import numpy as np
import torch

from megatron.errors import UserError

# Model-shape arguments NeoX asserts equal on load (check_checkpoint_args), plus the scheme.
CHECKED_ARGS = ("num_layers", "hidden_size", "num_attention_heads", "pos_emb")


INCOMPLETE = ".incomplete"  # suffix of a tag directory that is still being written


class CheckpointError(UserError):
    pass


def tag_for(iteration: int) -> str:
    return f"global_step{iteration}"


def read_latest(ckpt_dir: str) -> str | None:
    path = os.path.join(ckpt_dir, "latest")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        tag = f.read().strip()
    if not tag or not os.path.isdir(os.path.join(ckpt_dir, tag)):
        raise CheckpointError(
            f"{path} names checkpoint {tag!r}, but {os.path.join(ckpt_dir, tag)} does not exist; "
            "fix `latest` to name an existing global_step directory, or set `iteration:` to load one"
        )
    return tag


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
        save_dir, tag = self.ccfg.save, tag_for(iteration)
        staging = tag + INCOMPLETE
        client = {"iteration": iteration, "args": self.args, "config": self.cfg.to_flat_dict()}
        if not self.ccfg.no_save_rng:
            client.update(rng_state())
        client.update(extra_client_state or {})
        if self.is_rank0:
            shutil.rmtree(os.path.join(save_dir, staging), ignore_errors=True)
        _barrier()
        engine.save_checkpoint(save_dir, tag=staging, client_state=client, save_latest=False)
        _barrier()  # every rank's files are written before the directory is published
        if self.is_rank0:
            self._write_configs(os.path.join(save_dir, staging))
            final = os.path.join(save_dir, tag)
            if os.path.isdir(final):  # re-saving a step (never the one `latest` would lose)
                shutil.rmtree(final)
            os.replace(os.path.join(save_dir, staging), final)
            _fsync_dir(save_dir)
            _write_atomic(os.path.join(save_dir, "latest"), tag)
            self._prune(save_dir)
        _barrier()
        return os.path.join(save_dir, tag)

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

        if foreign_layout(c.load, tag_for(c.iteration) if c.iteration is not None else None):
            return self._load_foreign(engine)
        tag = tag_for(c.iteration) if c.iteration is not None else read_latest(c.load)
        if tag is None:
            print(f"[checkpoint] no `latest` in {c.load!r}: starting from scratch", flush=True)
            return None
        if not os.path.isdir(os.path.join(c.load, tag)):
            raise CheckpointError(f"checkpoint {os.path.join(c.load, tag)} does not exist (iteration: {c.iteration})")
        load_optim = not (c.no_load_optim or c.finetune)
        path, client = engine.load_checkpoint(
            c.load, tag=tag,
            load_optimizer_states=load_optim,
            load_lr_scheduler_states=load_optim,
            load_module_strict=True,
        )
        if path is None:
            raise CheckpointError(f"DeepSpeed could not load {os.path.join(c.load, tag)}")
        self._check_args(client.get("args", {}), os.path.join(c.load, tag))
        if not (c.no_load_rng or c.finetune) and "torch_rng_state" in client:
            set_rng_state(client)
        print(f"[checkpoint] loaded {path} (iteration {client.get('iteration')})", flush=True)
        if c.finetune:
            client["iteration"] = 0
        return client

    def _load_foreign(self, engine) -> dict:
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
        tag = tag_for(c.iteration) if c.iteration is not None else None
        ck = read_neox_checkpoint(c.load, tag, trust=trusted_from_env(), dtype=dtype)
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


def load_model_state(ckpt_dir: str, tag: str | None = None) -> tuple[dict, dict, str]:
    """Read the module weights and client state of one checkpoint without an engine (evaluate.py).

    Returns (state_dict, client_state, tag_dir)."""
    if not os.path.isdir(ckpt_dir):
        raise CheckpointError(f"checkpoint directory {ckpt_dir!r} does not exist")
    tag = tag or read_latest(ckpt_dir)
    if tag is None:
        raise CheckpointError(
            f"{ckpt_dir!r} has no `latest` file; pass the checkpoint directory that holds `latest` "
            "and global_step<N>/, or name a step with --iteration"
        )
    tag_dir = os.path.join(ckpt_dir, tag)
    path = os.path.join(tag_dir, "mp_rank_00_model_states.pt")
    zero3 = sorted(glob.glob(os.path.join(tag_dir, "*zero_pp_rank_*_mp_rank_00_model_states.pt")))
    if zero3 and not os.path.isfile(path):  # ZeRO-3: weights are partitioned over the optimizer files
        return _load_zero3(ckpt_dir, tag, zero3[0])
    if not os.path.isfile(path):
        raise CheckpointError(f"{path} is missing: {tag_dir} is not a complete sequential checkpoint")
    from megatron.parallel.merge_checkpoint import load_merged, shard_files
    from megatron.parallel.pipeline_merge import merge_pipeline_to_sequential

    if glob.glob(os.path.join(tag_dir, "layer_*-model_states.pt")):  # pipeline engine: weights in layer files
        blob = _read_checkpoint_file(path)
        client = {k: v for k, v in blob.items() if k not in ("module", "optimizer")}
        print(f"[checkpoint] read pipeline layer files of {tag_dir} into the sequential model", flush=True)
        return merge_pipeline_to_sequential(tag_dir), client, tag_dir
    shards = shard_files(tag_dir)
    if len(shards) > 1:  # saved with tensor parallelism: merge to TP=1 in memory
        module, client = load_merged(shards, _read_checkpoint_file)
        return module, client, tag_dir
    blob = _read_checkpoint_file(path)
    client = {k: v for k, v in blob.items() if k not in ("module", "optimizer")}
    return blob["module"], client, tag_dir


def _load_zero3(ckpt_dir: str, tag: str, first_model_file: str) -> tuple[dict, dict, str]:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    blob = _read_checkpoint_file(first_model_file)
    client = {k: v for k, v in blob.items() if k not in ("module", "optimizer")}
    print(f"[checkpoint] consolidated the ZeRO-3 partitions of {os.path.join(ckpt_dir, tag)}", flush=True)
    try:
        state = get_fp32_state_dict_from_zero_checkpoint(ckpt_dir, tag=tag)
    except Exception as e:  # a missing or truncated optimizer partition
        raise CheckpointError(f"could not consolidate ZeRO-3 checkpoint {os.path.join(ckpt_dir, tag)}: {e}") from e
    return dict(state), client, os.path.join(ckpt_dir, tag)


def _read_checkpoint_file(path: str) -> dict:
    try:
        # Our own checkpoints hold python/numpy objects (RNG state, DeepSpeed config) besides
        # tensors, so this is the full unpickler; only load checkpoint directories you trust.
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # truncated or corrupt file
        raise CheckpointError(f"could not read {path}: {e}; the file is truncated or corrupt") from e
