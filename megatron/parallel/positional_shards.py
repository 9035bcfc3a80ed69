"""The positional scheme's tensor-parallel shards: which dim of each of its tensors is split over
the TP ranks (read off the scheme itself), its tags, and a TP=1 copy gathered from every rank."""
from __future__ import annotations

import torch
from torch import nn

from megatron.parallel.shard_tags import REPLICATED, tag_shard_dim


def positional_shard_dims(pos_emb: str, options: dict | None = None) -> dict[str, int | None]:
    """{tensor name in the scheme's state_dict: dim split over TP ranks, or None if replicated}.

    Read off the scheme itself: build it for 4 heads at TP=1 and at TP=2 and see which dim of
    each tensor halves (KERPLE/ALiBi [H,1,1] -> 0; T5 [buckets, H] -> 1; rotary inv_freq and
    learned/sinusoidal tables -> None), so a new scheme needs no entry here. `options`: the
    model's PositionalSpec.options, for a scheme that reads its own hyperparameters there."""
    options = options or {}
    key = (pos_emb, repr(sorted(options.items())))
    if key not in _PROBED:
        _PROBED[key] = _probe(pos_emb, options)
    return _PROBED[key]


_PROBED: dict[tuple, dict] = {}


def _probe(pos_emb: str, options: dict) -> dict[str, int | None]:
    from megatron.positional.base import PositionalSpec
    from megatron.positional.registry import build_scheme

    def shapes(tp_rank: int, tp_size: int) -> dict[str, tuple]:
        spec = PositionalSpec(num_heads=4, head_dim=8, hidden_size=32, max_position_embeddings=16,
                              rpe_num_buckets=6, rpe_max_distance=12, tp_rank=tp_rank, tp_size=tp_size,
                              options=options)
        return {k: tuple(v.shape) for k, v in build_scheme(pos_emb, spec).state_dict().items()}

    with torch.random.fork_rng(devices=[]):  # building a scheme draws its init: leave no trace
        full, half = shapes(0, 1), shapes(0, 2)
    dims = {}
    for name, shape in full.items():
        diff = [d for d, (a, b) in enumerate(zip(shape, half[name], strict=True)) if a != b]
        if len(diff) > 1 or any(shape[d] != 2 * half[name][d] for d in diff):
            raise ValueError(f"pos-emb {pos_emb!r} tensor {name!r} is {shape} for 4 heads and {half[name]} for "
                             "a rank's 2 of them: a tensor-parallel shard must hold half of at most one dim")
        dims[name] = diff[0] if diff else REPLICATED
    return dims


def tag_scheme(scheme: nn.Module, pos_emb: str, options: dict | None = None) -> None:
    """Tag each tensor of the model's scheme with its split dim (shard_tags.py)."""
    dims = positional_shard_dims(pos_emb, options)
    for name, t in scheme.state_dict(keep_vars=True).items():
        if name not in dims:
            raise ValueError(f"pos-emb {pos_emb!r} built a tensor {name!r} that its 4-head probe "
                             "(positional_shard_dims) does not have; its state_dict keys must not depend on the config")
        tag_shard_dim(t, dims[name])


def gather_full_scheme(scheme, full_spec, pos_emb: str, parallel):
    """A TP=1 copy of this rank's positional scheme holding every head (all-gathered over the TP
    group), e.g. to log KERPLE's per-head statistics over all heads. Collective: call on every rank."""
    from megatron.positional.registry import build_scheme

    with torch.random.fork_rng(devices=[]):  # the copy's own init draws must leave no trace
        full = build_scheme(pos_emb, full_spec)
    dims = positional_shard_dims(pos_emb, full_spec.options)
    state = {}
    for name, t in scheme.state_dict().items():
        if dims.get(name) is None:
            state[name] = t
            continue
        parts = [torch.empty_like(t) for _ in range(parallel.tp_size)]
        torch.distributed.all_gather(parts, t.detach().contiguous(), group=parallel.tp_group)
        state[name] = torch.cat(parts, dim=dims[name])
    full.load_state_dict(state)
    return full
