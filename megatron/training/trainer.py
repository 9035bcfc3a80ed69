"""The training loop, torchtitan-style: train() -> train_step() -> forward_backward().

Everything goes through the DeepSpeed engine (ZeRO, precision, gradient accumulation, clipping,
checkpoint I/O); this file only decides what to feed it and when to evaluate, log and save.
"""
from __future__ import annotations

import dataclasses
import math
import random
import signal
import sys
import time

import numpy as np
import torch

from megatron.config.inputs import reads_tokenizer
from megatron.config.originals import publish_staged
from megatron.console import seconds_since_start
from megatron.data.loader import batch_loader, loss_mask_for
from megatron.data.position_recipes import PositionRecipe, to_device
from megatron.device import collective_device
from megatron.device import describe as describe_device
from megatron.errors import is_out_of_memory, out_of_memory
from megatron.host_reads import read_values
from megatron.model import GPTModel, count_parameters
from megatron.parallel import context_for, parallelize
from megatron.process import stop_signals
from megatron.process.disk import check_run_room, first_missing, remove_created
from megatron.process.distributed import init_distributed
from megatron.process.logging import MetricsLogger
from megatron.process.run_lock import RunLock, describe, training_locks
from megatron.process.stop_signals import PreemptionHandler
from megatron.tokenizer import build_tokenizer, padded_vocab_size
from megatron.training import health, norms, throughput
from megatron.training.checkpoint import Checkpointer
from megatron.training.data_setup import build_datasets, check_data_tokenizer, check_document_eod
from megatron.training.finished import finished_note, is_finished, recorded_changes
from megatron.training.neox_runtime import IntervalRuntime, RunShape
from megatron.training.optim import build_optimizer
from megatron.training.pipeline_step import (
    build_pipeline_engine,
    data_parallel_info,
    pipe_batches,
    pipeline_eval_step,
    pipeline_train_step,
    uses_pipeline,
)
from megatron.training.projection import project_positional
from megatron.training.schedule import build_scheduler
from megatron.training.throughput import Throughput
from megatron.training.timers import Timers


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_vocab(cfg):
    """(tokenizer or None, padded vocab size). The tokenizer is only needed for its size/EOD."""
    d, m = cfg.data, cfg.model
    tok = None
    if reads_tokenizer(cfg):
        tok = build_tokenizer(d.tokenizer_type, d.vocab_file, d.merge_file)
    size = m.padded_vocab_size or padded_vocab_size(
        tok.vocab_size, m.make_vocab_size_divisible_by, cfg.parallel.model_parallel_size)
    return tok, size


# The one answer for CPUs (docs/launching.md's too): bf16 is emulated there unless the CPU has AVX512-BF16.
CPU_PRECISION = ("on CPU train in fp32 (`precision: fp32`, or drop the fp16/bf16 sections): bf16 matmuls run "
                 "10-100x slower than fp32 on CPUs without AVX512-BF16; bf16 and fp16 are for GPUs")


def check_precision_supported(cfg, device: torch.device) -> str | None:
    """Refuses fp16 off CUDA; returns a warning for bf16 on CPU (it works, ~35x slower here), else None."""
    if device.type == "cuda":
        return None
    if cfg.precision.dtype == "fp16":
        raise ValueError(f"fp16 training needs a GPU: DeepSpeed's CPU accelerator has no fp16 support; {CPU_PRECISION}")
    if cfg.precision.dtype == "bf16":
        return f"[precision] warning: bf16 on CPU runs 10-100x slower than fp32; {CPU_PRECISION}"
    return None


class Trainer:
    def __init__(self, cfg, resolved_config: str | None = None):
        """`resolved_config`: the file the config was read from; a launch's staged one is moved
        into the run directory once set-up (the resume checks included) has passed."""
        import deepspeed  # lazy: seconds of imports; a module importing the trainer's helpers need not pay them

        self.cfg = cfg
        stop_signals.hold()  # a stop posted across hosts during set-up waits for the training loop's handler
        p = cfg.parallel
        self.dist = init_distributed(p.device, p.distributed_backend, p.distributed_timeout_minutes,
                                     p.lost_host_timeout, lambda: Checkpointer.resume_note(cfg.checkpoint.save))
        precision_warning = check_precision_supported(cfg, self.dist.device)
        if precision_warning and self.dist.is_rank0:
            print(precision_warning, file=sys.stderr, flush=True)
        created = first_missing(cfg.logging.run_dir) if self.dist.is_rank0 else None
        self.locks = self._lock_outputs()
        try:
            self._setup(deepspeed)
        except BaseException:
            self.release(restore=True)  # the lock files as they were: a refusal changes nothing
            remove_created(created)  # a refused start leaves no run directory it made (locks, logs)
            raise
        if self.dist.is_rank0 and not self.finished:  # the launch's checks passed: its config becomes the run's
            publish_staged(resolved_config)  # (a finished run keeps the record of how it was trained)

    def _lock_outputs(self) -> list[RunLock]:
        """One run per run directory and per checkpoint directory (what it writes), held by rank 0
        until train() ends or the process dies."""
        if not self.dist.is_rank0:
            return []
        check_run_room(self.cfg)  # a full disk: one message naming the directory (disk.py)
        locks = []
        try:
            for lock in training_locks(self.cfg):
                locks.append(lock.acquire())
                if lock.stale:
                    print(f"[lock] took over {lock.path}: its holder ({describe(lock.stale)}) is no longer running",
                          flush=True)
        except BaseException:
            for lock in locks:
                lock.release(restore=True)  # a refused start changes nothing
            raise
        return locks

    def release(self, restore: bool = False) -> None:
        """Let another run use the run and checkpoint directories (train() does this when it ends);
        restore: a refused start, whose lock files get back their bytes and times (RunLock.release)."""
        for lock in self.locks:
            lock.release(restore)

    def _setup(self, deepspeed) -> None:
        cfg = self.cfg
        set_seed(cfg.training.seed)
        self.par = context_for(cfg, self.dist)  # tensor-parallel groups; data-parallel rank/size
        check_document_eod(cfg, build_tokenizer)  # the document keys' end-of-document token, named
        self.tokenizer, self.vocab_size = resolve_vocab(cfg)
        check_data_tokenizer(cfg)  # another tokenizer's data: refused before the engine is built
        self.run_dir = cfg.logging.run_dir
        self.pipe = uses_pipeline(cfg)  # NeoX: pipe-parallel-size >= 1 -> DeepSpeed's pipeline engine
        self.engine, model, self.par = self._build_engine(deepspeed)
        # Once, here: the data-parallel size is final only now (pipeline: world / pp stages).
        self.batch, self.micro, self.gas = cfg.training.batch_sizes(self.par.dp_size)
        self.model = model
        self.checkpointer = Checkpointer(cfg, self.vocab_size, self.dist.is_rank0)
        client = self.checkpointer.load(self.engine)
        self.iteration = client["iteration"] if client else 0
        self._validated = (None, None)  # (iteration, metrics) of the last interval's validation
        self._restore_tp_rng(client)
        self.datasets = build_datasets(cfg, self.batch, self.tokenizer.vocab_size if self.tokenizer else self.vocab_size)
        self.recipe = PositionRecipe.from_config(cfg, self._eod())  # training's positions (position_recipes.py)
        self.loss_watch = health.LossWatch(cfg.training.max_nonfinite_loss_steps, self.checkpointer.resumed_from)
        self.finished = self._already_finished()
        # a finished run started again writes nothing: its log goes to the console only
        self.log = MetricsLogger(cfg, self.run_dir, self.dist.is_rank0, cfg.training.train_iters, self.iteration,
                                 sinks=not self.finished)
        # Filled by _gradient_norms before each optimizer step, unread: _step_metrics reads them
        self._grad_squares: list[torch.Tensor] | None = None
        self._grads: dict[str, torch.Tensor] = {}
        self.throughput, self.runtime = self._throughput()
        # NeoX's timers only where our loop runs the micro-batches (the pipe engine runs its own)
        self.timers = Timers(cfg.logging.wall_clock_breakdown and not self.pipe, self.dist.device,
                             cfg.logging.log_interval)
        self.log.console(f"device {describe_device(self.dist.device)} | process group {torch.distributed.get_backend()}")
        if not self.finished:  # a finished run started again adds no row (it does nothing)
            self.log.log_start(self.iteration, describe_device(self.dist.device), torch.distributed.get_world_size())
        self.log.console(f"model: {count_parameters(model):,} parameters | pos-emb {cfg.model.pos_emb} | "
                         f"attention backend {model.backend(self.dist.device, self._dtype()).name} | "
                         f"batch {self.batch} = micro {self.micro} x gas {self.gas} x dp {self.par.dp_size}"
                         + (f" | tp {self.par.tp_size}" if self.par.tp_size > 1 else "")
                         + f" | ready after {seconds_since_start():.1f}s")

    def _build_engine(self, deepspeed):
        """(engine, model, parallel context): the DeepSpeed engine around our model (sequential) or
        around GPTPipe (pipeline), whose engine decides the data-parallel rank and size."""
        cfg = self.cfg
        if self.pipe:
            engine, model = build_pipeline_engine(
                cfg, self.vocab_size, lambda m: build_optimizer(cfg, m), lambda o: build_scheduler(cfg, o))
            dp_rank, dp_size = data_parallel_info(engine)  # dp = world / pp
            return engine, model, dataclasses.replace(self.par, dp_rank=dp_rank, dp_size=dp_size)
        model = parallelize(GPTModel(cfg.model, self.vocab_size, cfg.training.checkpoint_activations), self.par)
        optimizer = build_optimizer(cfg, model)
        scheduler = build_scheduler(cfg, optimizer)
        engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler,
            config=cfg.deepspeed_config(self.par.dp_size), dist_init_required=False,
            mpu=self.par.deepspeed_mpu(),
        )
        return engine, model, self.par

    def _throughput(self) -> tuple[Throughput, IntervalRuntime]:
        """(our per-step tokens/s and MFU, NeoX's runtime/* figures per log interval)."""
        m = self.cfg.model
        peak, note = throughput.for_device(self.dist.device, self._dtype())
        self.log.console(f"[throughput] {note}")
        flops = 0.0
        if peak:  # counting the parameters of a sharded model takes a collective: only when needed
            n = throughput.full_parameter_count(self.model, getattr(self.engine, "mpu", None), self.par.dp_size)
            flops = throughput.flops_per_token(n, m.num_layers, m.hidden_size, m.seq_length)
        shape = RunShape(self.batch, m.seq_length, m.num_layers, m.hidden_size, self.vocab_size,
                         self.cfg.training.checkpoint_activations, self.dist.world_size, peak)
        return (Throughput(self.batch * m.seq_length, flops, self.dist.world_size, peak),
                IntervalRuntime(shape, self.cfg.logging.log_interval))

    def _eod(self):
        return getattr(self.tokenizer, "eod", None)

    def _dtype(self) -> torch.dtype:
        return self.cfg.precision.torch_dtype

    # ---- the loop ----------------------------------------------------------------------------
    def train(self) -> dict:
        """Train to train-iters (or exit-interval, or a stop signal), then evaluate; the result's
        exit_code is the process's exit status (130 after Ctrl-C)."""
        try:
            return self._train()
        finally:
            self.release()

    def _already_finished(self) -> bool:
        """This run was started again after it finished (megatron/training/finished.py's rule, on the
        iteration just loaded and the test split just built)."""
        return is_finished(self.cfg, self.run_dir, self.iteration, self.datasets[2] is not None)

    def _train(self) -> dict:
        t = self.cfg.training
        if self.finished:
            self.log.console(f"[train] {finished_note(self.cfg, self.iteration, recorded_changes(self.cfg))}")
            self.log.close()
            return {"iteration": self.iteration, "last": {}, "exit_code": 0, "already_finished": True}
        todo = t.train_iters - self.iteration
        if todo > 0 and self.datasets[0] is None:
            raise ValueError("train-iters > 0 but there is no training data")
        # Installed before the loader starts its workers, so they inherit a handler that only sets
        # a flag (Python's default would stop a worker on Ctrl-C and fail the next batch).
        preemption = PreemptionHandler().install()
        last = {}
        try:
            loader = iter(batch_loader(self.datasets[0], self.micro, self.gas, self.par.dp_rank, self.par.dp_size,
                                       self.iteration, max(todo, 0), t.num_workers, t.seed)) if todo > 0 else None
            if self.pipe and loader is not None:
                loader = pipe_batches(loader, self._eod(), self.cfg.data.eod_mask_loss)
            self._project_positional()  # the paper's fp32 code clamped before its first forward too
            self.runtime.start()  # NeoX's `interval time` starts with the loop
            while self.iteration < t.train_iters:
                start = time.perf_counter()
                loss = self.train_step(loader)
                self._project_positional()
                self.iteration += 1
                last, detail = self._step_metrics(loss, time.perf_counter() - start)
                self.log.log_step(self.iteration, last, detail)
                self.log.log_timers(self.iteration, self.timers.end_step(self.iteration))
                runtime = self.runtime.end_step(self.iteration)
                if runtime:
                    self.log.log_runtime(self.iteration, runtime)
                self.loss_watch.update(self.iteration, loss, self.checkpointer.latest)
                self._after_step()
                if preemption.requested():
                    return self._exit_on_signal(preemption, last)
                if t.exit_interval and self.iteration % t.exit_interval == 0:
                    break
        finally:
            preemption.uninstall()
        self.loss_watch.check_end(self.iteration, last.get("lm_loss", 0.0), self.checkpointer.latest)
        results = self.final_evaluation()
        self.log.close()
        return {"iteration": self.iteration, "last": last, "exit_code": 0, **results}

    def _exit_on_signal(self, preemption: PreemptionHandler, last: dict) -> dict:
        """Save this step (if saving is configured and it is not saved yet) and stop cleanly;
        exit_code: 130 after Ctrl-C, 0 after pre-emption (SIGTERM/SIGUSR1)."""
        signum = signal.Signals(preemption.received).name
        if self.cfg.checkpoint.save and not self.checkpointer.has_step(self.iteration):
            path = self._save()
            self.log.console(f"[signal] received signal {signum}: "
                             + (f"saved {path}, exiting" if path else "exiting without a checkpoint"))
        elif not self.cfg.checkpoint.save:
            self.log.console(f"[signal] received signal {signum}: no `save` directory set, exiting without a checkpoint")
        else:
            self.log.console(f"[signal] received signal {signum}: step {self.iteration} already saved, exiting")
        self.loss_watch.check_end(self.iteration, last.get("lm_loss", 0.0), self.checkpointer.latest)
        self.log.close()
        return {"iteration": self.iteration, "last": last, "preempted": True, "exit_code": preemption.exit_code}

    def train_step(self, loader) -> float:
        """One optimizer step = gas micro-batches; DeepSpeed accumulates and steps at the boundary."""
        try:
            return self._train_step(loader)
        except Exception as e:  # noqa: BLE001 - only out-of-memory is turned into an OutOfMemory
            if not is_out_of_memory(e):
                raise
            raise self._out_of_memory(e, "training", self.cfg.model.seq_length) from e

    def _out_of_memory(self, e: BaseException, doing: str, length: int) -> Exception:
        """OutOfMemory naming the length and micro batch that did not fit, and the fixes."""
        m, t = self.cfg.model, self.cfg.training
        key = "seq-length" if doing == "training" else "seq-length-val"
        return out_of_memory(
            e, f"{doing} at {key} {length} with train_micro_batch_size_per_gpu {self.micro}",
            f"lower train_micro_batch_size_per_gpu and raise gradient_accumulation_steps (now {self.gas}) "
            f"to keep the batch of {self.batch}"
            + ("" if t.checkpoint_activations or doing != "training" else ", set checkpoint-activations: true")
            + f", or use a fused attention backend (attention-backend: flash, flex or triton; now "
            f"{m.attention_backend})" + (f", or a shorter {key}" if doing != "training" else ""))

    def _train_step(self, loader) -> float:
        self.engine.train()
        if self.pipe:  # the pipe engine runs all gas micro-batches; its loss is already the DP mean
            return pipeline_train_step(self.engine, loader)
        losses = []
        for micro_step in range(self.gas):
            # NeoX's forward timer contains its batch generator (get_batch runs inside forward_step)
            with self.timers("forward"), self.timers("batch generator"):
                batch = next(loader)
                if self.recipe.active:  # seeded by (seed, iteration, micro-step, rank): exact resume
                    batch = {**batch, "recipe": self.recipe.batch_inputs(batch["tokens"], self.iteration, micro_step,
                                                                        self.par.dp_rank)}
            losses.append(self.forward_backward(batch))
        # One host read at the end of the step, not one after each micro-batch (each waited for
        # the device with the next micro-batch not yet queued)
        values = read_values(losses)
        return float(self._all_reduce_mean(torch.tensor(sum(values) / len(values))))

    def forward_backward(self, batch) -> torch.Tensor:
        """One micro-batch's forward, backward and (at the accumulation boundary) optimizer step;
        its loss, unread (a 0-d device tensor)."""
        with self.timers("forward"):
            with self.timers("batch generator"):  # NeoX's get_batch also moves the batch and builds the mask
                tokens, labels = batch["tokens"].to(self.dist.device), batch["labels"].to(self.dist.device)
                mask = loss_mask_for(tokens, self._eod(), self.cfg.data.eod_mask_loss).to(self.dist.device)
                recipe = to_device(batch.get("recipe", {}), self.dist.device)  # documents, drawn positions
            loss = self.engine(tokens, labels=labels, loss_mask=mask, **recipe)
        with self.timers("backward"):
            self.engine.backward(loss)
        if self.engine.is_gradient_accumulation_boundary():
            self._gradient_norms()  # ours, not in any NeoX timer
        with self.timers("optimizer"):  # NeoX times model.step() after every micro-batch, as here
            self.engine.step()
        return loss.detach()

    def _gradient_norms(self) -> None:
        """Between the last backward and the step: the gradient norms DeepSpeed does not give, as
        device values that _step_metrics reads (nothing is read here, mid-step)."""
        self._grad_squares, self._grads = None, {}
        if not hasattr(self.engine.optimizer, "_global_grad_norm"):  # a plain torch optimizer
            self._grad_squares = norms.grad_square_sums(self.model, getattr(self.engine, "mpu", None))
        if self.cfg.logging.log_grad_norm:
            self._grads.update({f"grad_norm/{k}": v for k, v in norms.per_parameter_grad_norms(self.model).items()})

    def _step_metrics(self, loss: float, seconds: float) -> tuple[dict, dict]:
        """(metrics for every sink, per-parameter details for metrics.jsonl/TensorBoard/W&B only).
        Every value that comes from the device is read with one host read (megatron/host_reads.py),
        on the rank that logs; the others only take part in the collectives (tensor parallelism,
        ZeRO-3), reading nothing but their share of a tensor-parallel gradient norm."""
        m = {"lm_loss": loss, "learning_rate": self.engine.get_lr()[0],
             "elapsed_time_per_iteration_ms": seconds * 1000.0,
             "samples_per_sec": self.batch / max(seconds, 1e-9)}
        m.update(self.throughput.metrics(seconds))  # tokens_per_sec, and mfu on CUDA
        squares, self._grad_squares = self._grad_squares, None
        grads, self._grads = self._grads, {}
        ds_norm = self.engine.get_global_grad_norm()
        squares = squares if ds_norm is None else None  # DeepSpeed's norm first, ours without it
        # Collectives on every rank: the parameter norms (ZeRO-3 gathers), the scheme (gathered
        # under TP and ZeRO-3), a tensor-parallel gradient norm's sum
        params = norms.per_parameter_norms(self.model) if self.cfg.logging.log_param_norm else {}
        clamped, raw = self._position_stats()
        mpu = getattr(self.engine, "mpu", None)
        device = squares[0].device if squares else None
        if not self.log.enabled:
            if squares is not None and mpu is not None:
                norms.norm_of_squares(read_values(squares), mpu, device)
            return m, {}
        pending = {**grads, **{f"param_norm/{k}": v for k, v in params.items()}, **clamped, **raw}
        if torch.is_tensor(ds_norm):
            pending["grad_norm"] = ds_norm
        own = squares or []
        values = read_values([*own, *pending.values()])
        read = dict(zip(pending, values[len(own):]))
        if squares is not None:
            m["grad_norm"] = norms.norm_of_squares(values[:len(own)], mpu, device)
        elif ds_norm is not None:
            m["grad_norm"] = read.pop("grad_norm") if torch.is_tensor(ds_norm) else float(ds_norm)
        if params:
            m["param_norm"] = norms.total({k: read[f"param_norm/{k}"] for k in params})
        m.update({k: read.pop(k) for k in clamped})  # KERPLE: bias_p_mean, bias_a_std, ... every step, as the paper
        # grad_norm/*, param_norm/*, then bias_p_raw_min, ..., bias_p_h0, ...: stored values (may
        # be below the floor), each head
        return m, read

    def _position_stats(self) -> tuple[dict, dict]:
        """(the scheme's clamped statistics, the stored values' statistics and each head's value),
        as 0-d tensors, unread."""
        def both():
            scheme = self.model.full_position()
            with torch.no_grad():
                return scheme.stat_tensors(), {**scheme.raw_stat_tensors(), **scheme.per_head_tensors()}

        if self.cfg.optimizer.zero_optimization.get("stage", 0) == 3:  # parameters are partitioned
            import deepspeed  # lazy: as in __init__ (ZeRO-3 only)

            with deepspeed.zero.GatheredParameters(list(self.model.position.parameters())):
                return both()
        return both()

    def _project_positional(self) -> None:
        """pos-clamp: projected: clamp the stored positional parameters into their domain."""
        if self.cfg.model.pos_clamp == "projected":
            project_positional(self.model.position, self.engine.optimizer)

    def _after_step(self) -> None:
        t = self.cfg.training
        if self.checkpointer.should_save(self.iteration):
            path = self._save()
            if path:
                self.log.console(f"[checkpoint] saved {path}")
        if t.eval_interval and self.iteration % t.eval_interval == 0 and self.datasets[1] is not None:
            metrics = self.evaluate("validation", self.datasets[1], f"iteration {self.iteration}",
                                    round_index=self.iteration // t.eval_interval)
            self._validated = (self.iteration, metrics)

    def final_evaluation(self) -> dict:
        """NeoX's end of training: save if this step was not saved yet, then validation and test."""
        out = {}
        if self.cfg.checkpoint.save and self.iteration > 0 and not self.checkpointer.has_step(self.iteration):
            self._save()
        eval_round = self.iteration // max(self.cfg.training.eval_interval, 1)
        done_at, metrics = self._validated
        if done_at == self.iteration:  # the last interval's evaluation: the same batches, already printed
            out["validation"] = metrics
        elif self.datasets[1] is not None:
            out["validation"] = self.evaluate("validation", self.datasets[1],
                                              "the end of training for val data", eval_round)
        if self.datasets[2] is not None:
            out["test"] = self.evaluate("test", self.datasets[2], "the end of training for test data", 0)
        return out

    def _save(self) -> str | None:
        """Checkpoint this step, unless its loss was non-finite (then the last checkpoint saved
        before it must stay the one `latest` names); the TP dropout stream travels with the default RNGs."""
        if not self.loss_watch.healthy:
            self.log.console(f"[checkpoint] not saving iteration {self.iteration}: its loss is not finite; "
                             f"keeping {self.checkpointer.latest() or 'no checkpoint'}")
            return None
        if not health.weights_finite(self.model):
            raise health.broken_weights(self.iteration, self.checkpointer.latest(), self.checkpointer.resumed_from)
        extra = {} if self.cfg.checkpoint.no_save_rng else {"rng_tracker_states": self.par.rng.state_dict()}
        return self.checkpointer.save(self.engine, self.iteration, extra)

    def _restore_tp_rng(self, client: dict | None) -> None:
        c = self.cfg.checkpoint
        if client and "rng_tracker_states" in client and not (c.no_load_rng or c.finetune):
            self.par.rng.load_state_dict(client["rng_tracker_states"])

    @torch.no_grad()
    def evaluate(self, chart: str, dataset, prefix: str, round_index: int = 0) -> dict:
        """eval_iters x gas micro-batches; lm_loss = mean of per-batch token-mean losses."""
        try:
            return self._evaluate(chart, dataset, prefix, round_index)
        except Exception as e:  # noqa: BLE001 - only out-of-memory is turned into an OutOfMemory
            if not is_out_of_memory(e):
                raise
            length = self.cfg.training.seq_length_val or self.cfg.model.seq_length
            raise self._out_of_memory(e, f"evaluating {chart}", length) from e

    def _evaluate(self, chart: str, dataset, prefix: str, round_index: int) -> dict:
        t = self.cfg.training
        self.engine.eval()
        loader = batch_loader(dataset, self.micro, self.gas, self.par.dp_rank, self.par.dp_size,
                              round_index * t.eval_iters, t.eval_iters, 0, t.seed)
        if self.pipe:  # one eval_batch = gas micro-batches, already averaged over DP ranks
            batches = pipe_batches(iter(loader), self._eod(), self.cfg.data.eod_mask_loss)
            loss = sum(pipeline_eval_step(self.engine, batches) for _ in range(t.eval_iters)) / max(t.eval_iters, 1)
        else:
            losses = []
            for batch in loader:
                tokens, labels = batch["tokens"].to(self.dist.device), batch["labels"].to(self.dist.device)
                mask = loss_mask_for(tokens, self._eod(), self.cfg.data.eod_mask_loss)
                losses.append(self.engine(tokens, labels=labels, loss_mask=mask.to(self.dist.device)).float().item())
            loss = float(self._all_reduce_mean(torch.tensor(sum(losses) / max(len(losses), 1))))
        self.engine.train()
        metrics = {"lm_loss": loss, "lm_loss_ppl": math.exp(min(loss, 700.0))}
        windows = (f"{t.eval_iters * self.batch} windows of {self.cfg.training.seq_length_val or self.cfg.model.seq_length} "
                   f"tokens of the {chart} split (eval-iters {t.eval_iters} x batch {self.batch}, its shuffled "
                   "sample order)")
        self.log.log_eval(self.iteration, chart, metrics, prefix, windows=windows)
        return metrics

    def _all_reduce_mean(self, x: torch.Tensor) -> torch.Tensor:
        if self.dist.world_size > 1:
            x = x.to(collective_device())
            torch.distributed.all_reduce(x)
            x = x / self.dist.world_size
        return x
