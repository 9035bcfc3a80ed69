"""Merge the per-rank module state dicts of a tensor-parallel checkpoint into one TP=1 state dict.

How each key is merged follows from the role of its layer (megatron/model/linear.py) -- the same
rules as NeoX's convert_neox_to_hf.py, except that row-parallel biases are NOT summed: ours
(megatron-core's RowParallelLinear) hold the full bias on every rank and add it once, after the
all-reduce, so they are identical copies.

    key (suffix)                               split over TP ranks      merge
    word_embeddings.weight                     vocab rows               cat dim 0
    output_layer.weight                        vocab rows               cat dim 0
    attention.query_key_value.{weight,bias}    whole heads (rows)       cat dim 0
    mlp.dense_h_to_4h.{weight,bias}            output features          cat dim 0
    attention.dense.weight, mlp.dense_4h_to_h.weight   input features   cat dim 1
    attention.dense.bias, mlp.dense_4h_to_h.bias       replicated       rank 0 (checked equal)
    *layernorm.*, final_norm.*                 replicated               rank 0 (checked equal)
    position.<name>                            this rank's heads        see positional_shard_dims
"""
from __future__ import annotations

import functools
import re

import torch

REPLICATED = None  # a merge rule: identical on every rank, keep rank 0's copy

# (regex on the full key, concat dim or REPLICATED); first match wins.
RULES: tuple[tuple[str, int | None], ...] = (
    (r"(^|\.)word_embeddings\.weight$", 0),
    (r"(^|\.)output_layer\.weight$", 0),
    (r"\.query_key_value\.(weight|bias)$", 0),
    (r"\.dense_h_to_4h\.(weight|bias)$", 0),
    (r"\.attention\.dense\.weight$", 1),
    (r"\.dense_4h_to_h\.weight$", 1),
    (r"\.attention\.dense\.bias$", REPLICATED),
    (r"\.dense_4h_to_h\.bias$", REPLICATED),
    (r"(layernorm|final_norm)\.(weight|bias)$", REPLICATED),
)


@functools.cache
def positional_shard_dims(pos_emb: str) -> dict[str, int | None]:
    """{tensor name in the scheme's state_dict: dim split over TP ranks, or None if replicated}.

    Read off the scheme itself: build it for 4 heads at TP=1 and at TP=2 and see which dim of
    each tensor halves (KERPLE/ALiBi [H,1,1] -> 0; T5 [buckets, H] -> 1; rotary inv_freq and
    learned/sinusoidal tables -> None), so a new scheme needs no entry here."""
    from megatron.positional.base import PositionalSpec
    from megatron.positional.registry import build_scheme

    def shapes(tp_rank: int, tp_size: int) -> dict[str, tuple]:
        spec = PositionalSpec(num_heads=4, head_dim=8, hidden_size=32, max_position_embeddings=16,
                              rpe_num_buckets=6, rpe_max_distance=12, tp_rank=tp_rank, tp_size=tp_size)
        return {k: tuple(v.shape) for k, v in build_scheme(pos_emb, spec).state_dict().items()}

    with torch.random.fork_rng(devices=[]):  # building a scheme draws its init: leave no trace
        full, half = shapes(0, 1), shapes(0, 2)
    dims = {}
    for name, shape in full.items():
        diff = [d for d, (a, b) in enumerate(zip(shape, half[name], strict=True)) if a != b]
        assert len(diff) <= 1 and all(shape[d] == 2 * half[name][d] for d in diff), (pos_emb, name)
        dims[name] = diff[0] if diff else REPLICATED
    return dims


def merge_rule(key: str, pos_emb: str) -> int | None:
    """The concat dim for `key`, or REPLICATED; ValueError for a key no rule covers."""
    if key.startswith("position."):
        name = key[len("position."):]
        dims = positional_shard_dims(pos_emb)
        if name not in dims:
            raise ValueError(f"checkpoint key {key!r} is not a tensor of pos-emb {pos_emb!r}")
        return dims[name]
    for pattern, dim in RULES:
        if re.search(pattern, key):
            return dim
    raise ValueError(f"no tensor-parallel merge rule for checkpoint key {key!r}; add one to "
                     "megatron/parallel/merge.py RULES")


def merge_state_dicts(shards: list[dict], pos_emb: str, rtol: float = 1e-5, atol: float = 1e-6) -> dict:
    """Per-rank state dicts (rank order) -> one TP=1 state dict with the same keys."""
    assert shards, "no shards to merge"
    keys = [k for k in shards[0] if not k.endswith("_extra_state")]
    for r, sd in enumerate(shards[1:], 1):
        other = [k for k in sd if not k.endswith("_extra_state")]
        if set(other) != set(keys):
            raise ValueError(f"tensor-parallel shard {r} has different keys than shard 0: "
                             f"{sorted(set(other) ^ set(keys))[:6]}")
    merged = {}
    for key in keys:
        parts = [sd[key] for sd in shards]
        dim = merge_rule(key, pos_emb)
        if dim is REPLICATED:
            for r, p in enumerate(parts[1:], 1):
                if p.shape != parts[0].shape or not torch.allclose(p.float(), parts[0].float(), rtol=rtol, atol=atol):
                    raise ValueError(f"{key} should be identical on every tensor-parallel rank, "
                                     f"but rank {r} differs from rank 0")
            merged[key] = parts[0].clone()
        else:
            merged[key] = torch.cat(parts, dim=dim)
    return merged


def gather_full_scheme(scheme, full_spec, pos_emb: str, parallel):
    """A TP=1 copy of this rank's positional scheme holding every head (all-gathered over the TP
    group), e.g. to log KERPLE's per-head statistics over all heads. Collective: call on every rank."""
    from megatron.positional.registry import build_scheme

    with torch.random.fork_rng(devices=[]):  # the copy's own init draws must leave no trace
        full = build_scheme(pos_emb, full_spec)
    dims = positional_shard_dims(pos_emb)
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
