"""How the tensor-parallel shards of one tensor lie: whole on every rank (REPLICATED), split
contiguously along one dim, or split group by group (row groups). megatron/parallel/plan.py says
which tensor lies which way; the split (plan.py, layers.py) and the merge (merge.py) use these."""
from __future__ import annotations

import torch

REPLICATED = None  # the dim of a tensor every rank holds whole (the merge keeps rank 0's, checked equal)


def group_shards(full: torch.Tensor, groups: tuple[int, ...], tp_size: int, dim: int = 0) -> torch.Tensor:
    """`full` reordered so that contiguous chunks are the ranks' grouped shards: its split dim holds
    consecutive groups of these (full) sizes, each split over the ranks on its own, and rank r holds
    [group 0's r-th chunk | group 1's r-th chunk | ...] (a gated MLP's [x | gate] halves,
    grouped-query attention's [Q | K | V]; NeoX's per-rank layouts)."""
    pieces = [g.chunk(tp_size, dim=dim) for g in full.split(list(groups), dim=dim)]
    return torch.cat([pieces[i][r] for r in range(tp_size) for i in range(len(groups))], dim=dim)


def ungroup_shards(parts: list[torch.Tensor], groups: tuple[int, ...], dim: int = 0) -> torch.Tensor:
    """The inverse of group_shards over the ranks' parts (rank order): the full tensor."""
    tp = len(parts)
    split = [p.split([g // tp for g in groups], dim=dim) for p in parts]
    return torch.cat([torch.cat([split[r][i] for r in range(tp)], dim=dim) for i in range(len(groups))], dim=dim)


def scheme_dims(scheme) -> dict[str, int | None]:
    """{tensor name in the positional scheme's state_dict: the dim of its heads, or REPLICATED},
    from what the scheme declares (PositionalScheme.head_dims, megatron/positional/base.py)."""
    return {name: scheme.head_dims.get(name, REPLICATED) for name in scheme.state_dict()}
