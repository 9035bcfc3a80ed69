"""Iterations, batch sizes, evaluation cadence, seed and activation checkpointing."""
from __future__ import annotations

from dataclasses import dataclass

from megatron.config.errors import ConfigError
from megatron.config.fields import key


@dataclass(frozen=True)
class TrainingConfig:
    train_iters: int = key(required=True, doc="Optimizer steps to train; 0 = evaluate only.", ge=0)
    train_batch_size: int | None = key(
        None, "Global batch = micro-batch * gradient-accumulation-steps * data-parallel size; any "
        "two of the three determine the third.", ge=1)
    train_micro_batch_size_per_gpu: int | None = key(None, "Samples per GPU per forward pass.", ge=1)
    gradient_accumulation_steps: int | None = key(
        None, "Micro-batches per optimizer step; null = derived (1 if it cannot be).", ge=1)
    eval_interval: int = key(1000, "Validate every this many iterations.", ge=1)
    eval_iters: int = key(100, "Batches per validation/test evaluation.", ge=0)
    seq_length_val: int | None = key(
        None, "KERPLE 2022 key: validation and test windows use this length (extrapolation "
        "evaluation); null = seq-length.", ge=1)
    seed: int = key(1234, "Random seed.", ge=0)
    exit_interval: int | None = key(None, "Exit after an iteration divisible by this.", ge=1)
    max_nonfinite_loss_steps: int = key(
        0, "Consecutive optimizer steps with a NaN/inf loss tolerated before training stops with an "
        "error (0 = stop at the first). Steps DeepSpeed's fp16 loss scaler skips for overflowing "
        "gradients keep a finite loss and do not count. A step with a non-finite loss is never "
        "saved: the last checkpoint saved before it stays the one `latest` names.", ge=0)
    checkpoint_activations: bool = key(False, "Recompute activations in backward (saves memory).")
    checkpoint_num_layers: int = key(1, "Layers per activation-checkpoint chunk.", ge=1)
    partition_activations: bool = key(
        False, "NeoX: split checkpointed activations across model-parallel ranks (DeepSpeed "
        "checkpointing); activations are recomputed by torch.utils.checkpoint here.", inert=True)
    contiguous_checkpointing: bool = key(
        False, "NeoX: copy checkpointed activations into one buffer (DeepSpeed checkpointing).", inert=True)
    checkpoint_in_cpu: bool = key(
        False, "NeoX: keep checkpointed activations in CPU memory (DeepSpeed checkpointing).", inert=True)
    synchronize_each_layer: bool = key(
        False, "NeoX: synchronise CUDA after each checkpointed layer (DeepSpeed checkpointing).", inert=True)
    num_workers: int = key(2, "DataLoader worker processes.", ge=0)

    def check(self) -> list[tuple[str, str]]:
        tb, mb, gas = self.train_batch_size, self.train_micro_batch_size_per_gpu, self.gradient_accumulation_steps
        if tb is None and mb is None:
            return [("train_micro_batch_size_per_gpu",
                     "set train-micro-batch-size-per-gpu or train-batch-size (or both)")]
        if None not in (tb, mb, gas) and tb % (mb * gas):
            return [("train_batch_size", f"must be a multiple of micro-batch * accumulation "
                     f"({mb} * {gas})")]
        return []

    def batch_sizes(self, dp_world_size: int) -> tuple[int, int, int]:
        """(train_batch_size, micro, gas) with train = micro * gas * dp, as NeoX's
        calculate_batch_parameters derives them: any two given fix the third, one alone gets gas 1."""
        dp = dp_world_size
        tb, mb, gas = self.train_batch_size, self.train_micro_batch_size_per_gpu, self.gradient_accumulation_steps
        if tb is not None and mb is not None and gas is None:
            gas = tb // (mb * dp)
        elif tb is not None and gas is not None and mb is None:
            mb = tb // (gas * dp)
        elif mb is not None and tb is None:
            gas = gas or 1
            tb = mb * gas * dp
        elif tb is not None and mb is None and gas is None:
            gas, mb = 1, tb // dp
        elif tb is None and mb is None:
            raise ConfigError("set train-micro-batch-size-per-gpu or train-batch-size")
        if not (mb and gas) or tb != mb * gas * dp:
            raise ConfigError(
                f"inconsistent batch sizes: train-batch-size {self.train_batch_size} != "
                f"train-micro-batch-size-per-gpu {self.train_micro_batch_size_per_gpu} * "
                f"gradient-accumulation-steps {self.gradient_accumulation_steps} * "
                f"data-parallel size {dp}")
        return tb, mb, gas
