"""Save and resume a training run: the Checkpointer (formats, reading and writing of checkpoint
files live in megatron/checkpoint/; this module is about the run).

    <dir>/latest                                  text: the tag of the newest COMPLETE checkpoint
    <dir>/global_step<N>/mp_rank_00_model_states.pt  module + optimizer + lr_scheduler + client state
    <dir>/global_step<N>/configs/<each yml>       the user's original config files (as NeoX)
    <dir>/global_step<N>/resolved_config.yml      the validated, resolved config
    <dir>/global_step<N>/manifest.json            every file's size and hash, written last (checkpoint/manifest.py)

A save is atomic from the reader's side: DeepSpeed writes `global_step<N>.incomplete/`, we add
the configs and the manifest, rename it to `global_step<N>/` (an atomic rename), and only then replace `latest`
(temp file, fsync, os.replace; megatron/checkpoint/tags.py). A crash at any point leaves `latest`
naming the previous complete checkpoint; leftover `*.incomplete` directories are removed by the next
save, a leftover `latest.tmp<pid>` by the next save or start. A write that fails (disk full) raises
CheckpointSaveError saying so, where, and which step `latest` still names.

Loading reads `latest` once per load and only accepts a plain tag inside the directory (tags.py);
every file, ours included, is read with weights_only=True and an allow-list
(megatron/checkpoint/safe_load.py; DeepSpeed's reads go through checkpoint/deepspeed_engine.py) and
refused when it holds NaN/inf (checkpoint/finite.py) unless allowed. A NeoX / KERPLE checkpoint
(checkpoint/layout.py decides) is read by checkpoint/reader.py as a fine-tune start.
"""
from __future__ import annotations

import os
import random
import shutil

import numpy as np
import torch

from megatron.atomic_io import fsync_path, remove_quietly
from megatron.checkpoint import writer
from megatron.checkpoint.client import CHECKED_ARGS, model_args
from megatron.checkpoint.compat import differences, refuse_shape_change, saved_model, strict_load_error
from megatron.checkpoint.deepspeed_engine import install_safe_loading, safe_zero_to_fp32
from megatron.checkpoint.errors import CheckpointError, CheckpointSaveError
from megatron.checkpoint.layout import detect_layout, is_neox
from megatron.checkpoint.manifest import check_step, model_keys, run_layout, write_manifest
from megatron.checkpoint.reader import read_tp1_state
from megatron.checkpoint.tags import (
    LATEST,
    clean_stale_tmp,
    describe_steps,
    latest_and_resume,
    missing_latest,
    read_latest,
    resolve_tag,
    step_of,
    steps_in,
    tag_for,
    write_latest,
)
from megatron.checkpoint.trust import TRUST_HINT, trusted_from_env
from megatron.console import say
from megatron.device import collective_device
from megatron.outputs_vs_inputs import refuse_overlap

INCOMPLETE = ".incomplete"  # suffix of a tag directory that is still being written


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


# A fine-tune's own checkpoints resume like any run's: without the keys that start from another
# model's weights at iteration 0 (issue 54 item 8: the advice to resume named only `load`).
_RESUME_NOT_FINETUNE = " and `finetune: false` (and no `finetune-new-pos-emb`: the scheme is already replaced)"


def _starts_anew(c) -> bool:
    """This config starts from `load`'s weights at iteration 0 (finetune or a scheme replaced)."""
    return bool(c.finetune or c.finetune_new_pos_emb)


class Checkpointer:
    """Saves and restores a DeepSpeed engine plus our client state (iteration, RNG, config)."""

    def __init__(self, cfg, padded_vocab_size: int, is_rank0: bool = True):
        self.cfg = cfg
        self.ccfg = cfg.checkpoint
        self.args = model_args(cfg, padded_vocab_size)
        self.is_rank0 = is_rank0
        self.resumed_from: tuple[str, int] | None = None  # (step directory, iteration) a resume continued
        if is_rank0 and self.ccfg.save:
            clean_stale_tmp(self.ccfg.save)  # a `latest.tmp<pid>` left by a killed writer

    @staticmethod
    def resume_note(save: str | None) -> str:
        """What a run that stopped keeps, and how to go on (`save`'s `latest`): the last line of a
        stopped run, said by the heartbeat before any Checkpointer exists (megatron/process/)."""
        return latest_and_resume(save)

    def latest(self) -> str | None:
        """The step directory `save`'s `latest` names, or None (no save directory, nothing saved)."""
        save = self.ccfg.save
        tag = read_latest(save) if save else None
        return os.path.join(save, tag) if tag else None

    def has_step(self, iteration: int) -> bool:
        """Whether `save` holds the step directory of `iteration`."""
        return os.path.isdir(os.path.join(self.ccfg.save, tag_for(iteration)))

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
        world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        # last, over every rank's files (they are all written: _raise_if_failed agreed), before `latest`
        write_manifest(os.path.join(save_dir, staging), tag, run_layout(self.cfg, world), model_keys(self.cfg),
                       step_of(tag))
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
        if failure is not None and not writer.is_write_failure(failure):
            raise failure  # a bug, not the disk: keep its traceback
        free = writer.free_bytes(save_dir)  # before the partial directory is removed and frees its space
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
        for step in steps_in(save_dir)[:-keep]:
            if tag_for(step) != latest:
                shutil.rmtree(os.path.join(save_dir, tag_for(step)), ignore_errors=True)

    def check(self, quiet: bool = False) -> tuple[str | None, bool]:
        """Every refusal of load() that needs no engine and no process group: deepy.py runs it before
        it starts any process (a refused resume costs seconds, not a launch), load() again. Returns
        the step to load (None: start from scratch) and whether its module weights alone are read
        (a NeoX checkpoint, a fine-tune start). `quiet`: no notes (deepy.py's run says them once)."""
        c = self.ccfg
        tag = self._tag_to_load()
        if tag is None or not _same_dir(c.load, c.save):
            self._refuse_taken_save_dir()
        if tag is None:
            return None, False
        tag_dir = os.path.join(c.load, tag)
        if not os.path.isdir(tag_dir):
            raise CheckpointError(f"checkpoint {tag_dir} does not exist (iteration: {c.iteration})")
        neox = is_neox(detect_layout(tag_dir))
        if c.finetune or neox:
            self._refuse_saving_into_load(tag)
        if neox or c.finetune_new_pos_emb or self._weights_only_start():
            return tag, True  # our reader checks the manifest
        self._check_manifest(tag_dir)
        self._check_saved_model(tag_dir, quiet)  # before DeepSpeed's strict load
        return tag, False

    def load(self, engine) -> dict | None:
        """Restore the engine from `load`; returns the client state, or None for a fresh start.
        A run that does not resume from `save` must not overwrite the checkpoints already there
        (_claim_save_dir)."""
        c = self.ccfg
        tag, weights_only = self.check()
        if tag is None or not _same_dir(c.load, c.save):
            self._claim_save_dir()
        if tag is None:
            if c.load:
                say(f"[checkpoint] no checkpoint in {c.load!r}: starting from scratch")
            return None
        if weights_only:
            return self._load_foreign(engine, tag)
        path, client = self._engine_load(engine, tag)
        if path is None:
            raise CheckpointError(f"DeepSpeed could not load {os.path.join(c.load, tag)}")
        self._check_args(client.get("args", {}), os.path.join(c.load, tag))
        if not (c.no_load_rng or c.finetune) and "torch_rng_state" in client:
            set_rng_state(client)
        say(f"[checkpoint] loaded {path} (iteration {client.get('iteration')})")
        if c.finetune:
            client["iteration"] = 0
        else:
            self.resumed_from = (os.path.join(c.load, tag), client.get("iteration", 0))
        return client

    def _refuse_saving_into_load(self, tag: str) -> None:
        """A run that starts from `load`'s weights at iteration 0 (finetune, a NeoX checkpoint) is a
        new run: its `save` must stay out of `load` (megatron/outputs_vs_inputs.py), or its first
        save would replace a step it was started from and move `latest` back to it."""
        c = self.ccfg
        if not c.save:  # a fine-tune that saves nothing cannot overwrite anything
            return
        steps = describe_steps(steps_in(c.load))
        refuse_overlap("save:", c.save, [(f"the checkpoints this run starts from at iteration 0 (load: {c.load}, "
                                          f"{steps}, `latest` {tag})", c.load)],
                       fix=f"give this run its own `save` (or run-dir), e.g. -o save={c.save.rstrip(os.sep)}_finetune; "
                           "its saves would otherwise replace those steps and move `latest` back"
                           + (f". To resume this fine-tune from its own checkpoints instead, keep `load: {c.load}`"
                              f"{_RESUME_NOT_FINETUNE}" if _starts_anew(c) else ""))

    def _tag_to_load(self) -> str | None:
        """The step to resume (`iteration:`, else the one `latest` names; read once, validated), or
        None to start from scratch. Step directories without `latest` are refused: starting from
        scratch would overwrite them (unless `overwrite-checkpoints` starts over in `save`)."""
        c = self.ccfg
        if not c.load:
            return None
        if c.iteration is not None:
            return resolve_tag(c.load, tag_for(c.iteration))
        tag = read_latest(c.load)
        steps = steps_in(c.load) if tag is None else []
        if steps and not (c.overwrite_checkpoints and _same_dir(c.load, c.save)):
            raise CheckpointError(
                f"load: {missing_latest(c.load, steps)}, or resume from any of them with `iteration: {steps[-1]}` "
                f"(-o iteration={steps[-1]}); to start over instead, set `overwrite-checkpoints: true` (deletes them) "
                "or give this run another `save` / run-dir")
        return tag

    def _refuse_taken_save_dir(self) -> None:
        """This run does not resume from `save`: refuse if `save` holds checkpoints (the run would
        replace them step by step, and `latest` would move backwards), unless overwrite-checkpoints
        asks to start over (_claim_save_dir deletes them)."""
        c = self.ccfg
        steps = steps_in(c.save) if c.save else []
        if steps and not c.overwrite_checkpoints:
            latest = read_latest(c.save)
            raise CheckpointError(
                f"save: {c.save!r} already holds checkpoints {describe_steps(steps)}"
                + (f" (`latest` names {latest})" if latest else "")
                + f", and this run does not resume from them (load: {c.load or 'not set'}), so it would overwrite "
                f"them; resume them with `load: {c.save}`{_RESUME_NOT_FINETUNE if _starts_anew(c) else ''}, give "
                "this run its own `save` (or run-dir), or set `overwrite-checkpoints: true` to start over (they are "
                "deleted first)")

    def _claim_save_dir(self) -> None:
        """After check(): with overwrite-checkpoints, delete what `save` holds. Every rank looks
        before rank 0 deletes."""
        c = self.ccfg
        if not c.save:
            return
        steps = steps_in(c.save)
        _barrier()
        if steps and self.is_rank0:
            say(f"[checkpoint] overwrite-checkpoints: deleting {describe_steps(steps)} in {c.save}: "
                "this run starts over")
            remove_quietly(os.path.join(c.save, LATEST))  # first: `latest` never names a deleted step
            for step in steps:
                shutil.rmtree(os.path.join(c.save, tag_for(step)))
        _barrier()

    def _weights_only_error(self, tag_dir: str) -> CheckpointError:
        return CheckpointError(
            f"load: {tag_dir} holds the weights only, no optimizer state (a merged or converted checkpoint: "
            "tools/merge_tp_checkpoint.py, tools/convert_neox_checkpoint.py), so training cannot resume from it "
            "as it is; start from its weights with `finetune: true` (iteration 0, a new LR schedule) or "
            "`no-load-optim: true` (keeps its iteration count; a fresh optimizer and LR schedule)")

    def _engine_load(self, engine, tag: str):
        """engine.load_checkpoint with every file read by the safe reader (megatron/checkpoint/deepspeed_engine.py)."""
        c = self.ccfg
        trust = trusted_from_env()
        if engine.load_universal_checkpoint() and not trust:
            raise CheckpointError(f"load: {c.load!r}: DeepSpeed reads universal checkpoints with its own full "
                                  f"(code-executing) unpickler, which safe loading cannot check; {TRUST_HINT}")
        tag_dir = os.path.join(c.load, tag)
        install_safe_loading(engine, trust, c.allow_nonfinite_weights, tag_dir)
        load_optim = not (c.no_load_optim or c.finetune)
        # ZeRO finds no optimizer partitions in a weights-only step and silently starts a fresh
        # optimizer; without ZeRO DeepSpeed fails deep inside torch (AttributeError on None): the
        # file is read again only then.
        zero = self.cfg.optimizer.zero_optimization.get("stage", 0) >= 1
        if load_optim and zero and not writer.holds_optimizer_state(tag_dir, trust):
            raise self._weights_only_error(tag_dir)
        try:
            with safe_zero_to_fp32(trust, c.allow_nonfinite_weights, tag_dir):
                return engine.load_checkpoint(
                    c.load, tag=tag,
                    load_optimizer_states=load_optim,
                    load_lr_scheduler_states=load_optim,
                    load_module_strict=True,
                )
        except (AttributeError, KeyError, TypeError) as e:
            if load_optim and not zero and not writer.holds_optimizer_state(tag_dir, trust):
                raise self._weights_only_error(tag_dir) from e
            raise
        except RuntimeError as e:  # a model key outside the checked ones changed
            err = strict_load_error(e, tag_dir)
            if err is None:
                raise
            raise err from e

    def _check_manifest(self, tag_dir: str) -> None:
        """The step against its manifest (files, config), and its parallel layout against this run's:
        DeepSpeed's engine reads the files of its own layout only (a TP=2 step's mp_rank_00 alone
        is half of each split tensor)."""
        record = check_step(tag_dir)
        if record is None or not record.get("layout"):
            return
        saved, p = record["layout"], self.cfg.parallel
        bad = [f"{k.replace('_', '-')}: checkpoint {saved.get(k)}, config {v}"
               for k, v in (("model_parallel_size", p.model_parallel_size), ("pipe_parallel_size", p.pipe_parallel_size))
               if saved.get(k) is not None and saved.get(k) != v]
        if bad:
            raise CheckpointError(
                f"checkpoint {tag_dir} was saved with another parallel layout ({'; '.join(bad)}), which a resume "
                "cannot change; set them back, or merge it (tools/merge_tp_checkpoint.py) and start from its "
                "weights with `finetune: true`")

    def _check_saved_model(self, tag_dir: str, quiet: bool = False) -> None:
        """The checkpoint's saved model against this config's, from its resolved_config.yml: one
        message for every changed shape key, and for a changed seq-length (the sample order)."""
        saved = saved_model(tag_dir)
        if saved is None:  # not written by this stack's Checkpointer: _check_args after the load
            return
        m = self.cfg.model
        restart = ("Set them back to resume this run, or start a new run (another run-dir / save, without "
                   "load:); `finetune: true` starts from its weights only when just seq-length changed")
        refuse_shape_change(tag_dir, {k: getattr(saved, k) for k in CHECKED_ARGS}, self.args, restart)
        if saved.seq_length == m.seq_length or self.ccfg.finetune:
            return
        change = differences({"seq_length": saved.seq_length}, {"seq_length": m.seq_length}, ["seq_length"])[0]
        if not self.ccfg.allow_seq_length_change:
            raise CheckpointError(
                f"checkpoint {tag_dir} was trained with another sequence length ({change}): samples are cut at "
                "seq-length, so resuming would continue from the saved data position in a different sample order "
                "(some text seen twice, some never). Set seq-length back, set `allow-seq-length-change: true` to "
                "resume anyway, or `finetune: true` to start from its weights at iteration 0")
        if not quiet:
            say(f"[checkpoint] resuming with another sequence length ({change}; allow-seq-length-change: true): "
                "the sample order from here on differs from the saved run's")

    def _load_foreign(self, engine, tag: str) -> dict:
        """Module weights only, as a fine-tune start at iteration 0: a NeoX / KERPLE checkpoint (its
        optimizer state is DeepSpeed's from another codebase), or any checkpoint whose positional
        scheme this run replaces (finetune-new-pos-emb)."""
        c = self.ccfg
        if self.cfg.parallel.model_parallel_size > 1 or self.cfg.parallel.pipe_parallel_size >= 1:
            raise CheckpointError(f"load: {c.load!r} is read as weights only (a NeoX checkpoint, or "
                                  "finetune-new-pos-emb); convert or merge it first with tools/convert_neox_checkpoint.py "
                                  "/ tools/merge_tp_checkpoint.py, or train with model-parallel-size 1 and pipe-parallel-size 0")
        module = engine.module
        dtype = next(module.parameters()).dtype
        ck = read_tp1_state(c.load, tag, trust=trusted_from_env(), dtype=dtype,
                            allow_nonfinite=c.allow_nonfinite_weights)
        saved = {k: getattr(ck.cfg.model, k) for k in CHECKED_ARGS} | {"padded_vocab_size": ck.vocab_size}
        state, trained_with = ck.state, saved["pos_emb"]
        if c.finetune_new_pos_emb:
            state = self._without_positional(saved, state, ck.tag_dir)
        self._check_args(saved, ck.tag_dir)
        result = module.load_state_dict(state, strict=not c.finetune_new_pos_emb)
        if c.finetune_new_pos_emb:
            left = [k for k in result.missing_keys + result.unexpected_keys if not k.startswith("position.")]
            if left:
                raise CheckpointError(f"{ck.tag_dir}: besides the positional scheme, these tensors do not match the "
                                      f"model: {left[:6]}")
            fresh = sorted(k for k in result.missing_keys)
            say(f"[checkpoint] finetune-new-pos-emb: pos-emb {trained_with} -> {self.cfg.model.pos_emb}; "
                f"{', '.join(fresh) or 'no new tensors'} start from their initial values")
        if hasattr(engine.optimizer, "refresh_fp32_params"):  # bf16 / ZeRO keep fp32 master copies
            engine.optimizer.refresh_fp32_params()
        say(f"[checkpoint] loaded the module weights only of {ck.tag_dir} (no optimizer, LR schedule, "
            "RNG or data position): training starts at iteration 0")
        return {"iteration": 0}

    def _weights_only_start(self) -> bool:
        """finetune on one rank's model takes the weights alone: read by our reader (every layout,
        weights-only ones included: imported, converted, merged), not by DeepSpeed's engine, which
        expects a training checkpoint and would read the optimizer state only to drop it. Not under
        ZeRO-3, whose partitioned parameters only the engine's load fills."""
        one_rank = self.cfg.parallel.model_parallel_size == 1 and self.cfg.parallel.pipe_parallel_size < 1
        return self.ccfg.finetune and one_rank and self.cfg.optimizer.zero_optimization.get("stage", 0) < 3

    def _without_positional(self, saved: dict, state: dict, where: str) -> dict:
        """The checkpoint's tensors less its positional scheme's; `saved` then names this run's scheme."""
        if saved["pos_emb"] == self.cfg.model.pos_emb:
            raise CheckpointError(f"finetune-new-pos-emb: {where} was trained with pos-emb {saved['pos_emb']}, "
                                  "the one this config sets; remove finetune-new-pos-emb (nothing to replace)")
        saved["pos_emb"] = self.cfg.model.pos_emb
        return {k: v for k, v in state.items() if not k.startswith("position.")}

    def _check_args(self, saved: dict, where: str) -> None:
        refuse_shape_change(where, saved, self.args, "Set them back to the checkpoint's values, or start a new run")


def _same_dir(a: str | None, b: str | None) -> bool:
    return bool(a and b) and os.path.realpath(a) == os.path.realpath(b)


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

    flag = torch.tensor([1 if ok else 0], device=collective_device())
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
    return bool(flag.item())


def save_failure_message(save_dir: str, tag: str, error: BaseException | None, free: int | None) -> str:
    """What failed, where, what `latest` still names, and the fix."""
    try:
        previous = read_latest(save_dir)
    except CheckpointError:
        previous = None
    kept = (f"{os.path.join(save_dir, LATEST)} still names {previous}, the last complete checkpoint"
            if previous else f"there is no earlier complete checkpoint in {save_dir}")
    return (f"could not save checkpoint {tag} into {save_dir}: {writer.describe_write_failure(error, free)}; {kept}, and the "
            f"partial {tag}{INCOMPLETE} was removed. Free space there (or set `save:` to another directory) "
            f"and resume with `load:`")
