"""Batches for the trainer, indexed by iteration so a resumed run reads exactly the samples the
uninterrupted run would have read (no sampler state to save).

Global batch k holds samples [k*G, (k+1)*G) of the (already shuffled) dataset, G = micro*gas*dp.
Micro-step m of DP rank r reads the contiguous slice [k*G + m*micro*dp + r*micro, ... + micro),
which is NeoX's DistributedBatchSampler order. Indices wrap around the dataset (NeoX cycles).
"""
from __future__ import annotations

import signal

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler


class IterationSampler(Sampler):
    def __init__(self, num_samples: int, micro: int, gas: int, dp_rank: int, dp_size: int,
                 start_iteration: int, num_iterations: int):
        self.n, self.micro, self.gas = num_samples, micro, gas
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.start, self.stop = start_iteration, start_iteration + num_iterations

    def __len__(self) -> int:
        return (self.stop - self.start) * self.gas

    def __iter__(self):
        G = self.micro * self.gas * self.dp_size
        for k in range(self.start, self.stop):
            for m in range(self.gas):
                first = k * G + m * self.micro * self.dp_size + self.dp_rank * self.micro
                yield [i % self.n for i in range(first, first + self.micro)]


def collate(samples: list[dict]) -> dict[str, torch.Tensor]:
    text = torch.from_numpy(np.stack([s["text"] for s in samples]).astype(np.int64))
    return {"tokens": text[:, :-1].contiguous(), "labels": text[:, 1:].contiguous()}


def batch_loader(dataset, micro: int, gas: int, dp_rank: int, dp_size: int,
                 start_iteration: int, num_iterations: int, num_workers: int = 0, seed: int = 0) -> DataLoader:
    sampler = IterationSampler(len(dataset), micro, gas, dp_rank, dp_size, start_iteration, num_iterations)
    # Its own generator: without one, every iter() of a DataLoader draws its workers' base seed
    # from the global torch RNG -- the generator dropout uses -- so a resumed run (which creates
    # its iterator right after restoring that RNG) would draw different dropout masks.
    generator = torch.Generator()
    generator.manual_seed(seed)
    return DataLoader(dataset, batch_sampler=sampler, collate_fn=collate, num_workers=num_workers,
                      persistent_workers=False, generator=generator, worker_init_fn=_ignore_ctrl_c)


def _ignore_ctrl_c(worker_id: int) -> None:
    """Ctrl-C reaches the workers too (same process group); the main process decides when to stop
    them, after saving, so a worker must not die of the first one."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def loss_mask_for(tokens: torch.Tensor, eod: int | None, eod_mask_loss: bool) -> torch.Tensor:
    """NeoX: every position counts, unless eod_mask_loss drops the positions whose INPUT is EOD."""
    mask = torch.ones(tokens.shape, dtype=torch.float32)
    if eod_mask_loss and eod is not None:
        mask[tokens == eod] = 0.0
    return mask
