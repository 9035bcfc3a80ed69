"""Reading device values on the host, many at a time.

Every read of a GPU tensor's value (item, tolist, float) is a host sync: the host waits until
the device has run everything queued before it, and the device then idles until the host queues
more. The logs of a training step want a few dozen scalars (the loss, the gradient norm, the
positional scheme's statistics); read one at a time, each is such a wait. Here they are stacked
into one tensor per device and dtype and read with one `tolist`: the values are bit for bit
those of reading each alone (no cast), and a CPU tensor's read waits for nothing.
(megatron/positional/base.py has its own one-device reader: it ships without this package.)
"""
from __future__ import annotations

import torch


def read_values(tensors: list[torch.Tensor]) -> list[float]:
    """The values of 0-d (or one-element) tensors, in order, with one host read per (device,
    dtype) among them: one for a training step's logged scalars."""
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.device, t.dtype), []).append(i)
    values: list[float] = [0.0] * len(tensors)
    for indices in groups.values():
        stacked = torch.stack([tensors[i].detach().reshape(()) for i in indices])
        for i, v in zip(indices, stacked.tolist()):
            values[i] = v
    return values
