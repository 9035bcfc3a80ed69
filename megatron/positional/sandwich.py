"""Sandwich (Chi, Fan, Rudnicky, Ramadge, "Receptive Field Alignment Enables Transformer Length
Extrapolation", arXiv 2212.10356; authors' code github.com/chijames/Sandwich): the attention bias is
the inner product of two sinusoidal position embeddings of dimension d' (`sandwich-dim`), which
depends on the distance d = m - n only,

    p_m . p_n = sum_{i=1}^{d'/2} cos(d / 10000^(2i/d')),

shifted so the bias is 0 at d = 0 (minus d'/2: softmax ignores a constant) and compressed per head
as ALiBi does with its slopes: head h = 1..H divides it by 8h/H, so

    bias_h(d) = (sum_{i=1}^{d'/2} cos(d / 10000^(2i/d')) - d'/2) * H / (8 h).

It has no parameters. The authors' repository is not reachable from here; the per-head compression
and the frequencies i = 1..d'/2 follow NVIDIA NeMo's port of it
(nemo/collections/nlp/modules/common/megatron/position_embedding/sandwich_relative_position_embedding.py,
which cites the paper), including its default d' = head_dim.

The sum never settles (its slowest cosine has period 2*pi*10000 tokens), so no table of a fixed size
is exact at every length: the bias is a `lookup` DistanceKernel whose table is tabulated on demand
out to the largest distance a call needs (DistanceKernel.covering), grown in powers of two and kept
per device: H_local x 2^ceil(log2(L)) float32, 3 MiB for 12 heads at 65,536 tokens. Every backend
(dense hooks, flex's score_mod, the Triton kernel) reads that one table, computed once in float64."""
from __future__ import annotations

import torch

from .base import PositionalScheme, PositionalSpec
from .distance_kernel import DistanceKernel
from .options import Option
from .registry import register

MIN_TABLE = 256  # the smallest table (distances 0..255): short runs never rebuild it

DIM = Option("sandwich_dim", int | None, None, "Sinusoid dimension d' of the Sandwich bias (pos-emb sandwich): "
             "an even number; null = the head dimension.", ge=2)


@register("sandwich")
class Sandwich(PositionalScheme):
    options = (DIM,)

    def __init__(self, spec: PositionalSpec):
        super().__init__(spec)
        self.dim = self.option("sandwich_dim") or spec.head_dim  # d'
        if self.dim < 2 or self.dim % 2:
            raise ValueError(f"sandwich-dim must be an even integer >= 2, got {self.dim}")
        # 1 / (8h/H) for this rank's heads h (1-based). Python floats, not a tensor: a model built
        # on the meta device (Hugging Face's from_pretrained) must still tabulate real values.
        heads = range(1, spec.num_heads + 1)[spec.head_slice]
        self.head_scale = [spec.num_heads / (8.0 * h) for h in heads]
        self._tables: dict[torch.device, torch.Tensor] = {}  # device -> (H_local, m + 1) float32

    @classmethod
    def option_problems(cls, values: dict) -> list[tuple[str, str]]:
        dim = DIM.read(values)
        return [("sandwich_dim", "must be even (d'/2 cosines)")] if isinstance(dim, int) and dim % 2 else []

    def table(self, n: int, device: torch.device) -> torch.Tensor:
        """(H_local, m + 1) float32, the bias at d = 0..m, m + 1 = a power of two > n."""
        have = self._tables.get(device)
        if have is not None and have.shape[1] > n:
            return have
        size = max(MIN_TABLE, 1 << n.bit_length())
        d = torch.arange(size, dtype=torch.float64, device=device)
        total = torch.zeros_like(d)
        for i in range(1, self.dim // 2 + 1):  # one cosine at a time: memory O(size), not O(size * d')
            total += torch.cos(d / 10000.0 ** (2.0 * i / self.dim))
        bias = (total - self.dim / 2) * torch.tensor(self.head_scale, dtype=torch.float64, device=device)[:, None]
        self._tables[device] = bias.float().contiguous()
        return self._tables[device]

    def fused_kernel(self) -> DistanceKernel:
        return DistanceKernel(bias="lookup", tabulate=self.table)
