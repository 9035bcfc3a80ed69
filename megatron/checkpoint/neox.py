"""Read a NeoX / KERPLE checkpoint step (either layout, any TP degree) into our TP=1 state dict;
megatron/checkpoint/reader.read_tp1_state calls it for the neox-* layouts (layout.py).

Steps: read every file with weights_only=True and check it for NaN/inf (safe_load.py), rename the keys
(neox_keys.py), check the positional scheme's per-layer copies agree, check every tensor's
shape against the model the config describes (naming the file, key, expected and found shape),
merge the TP shards (megatron/parallel/merge.py, by the tensor-parallel plan of the model the config
describes: the renamed keys are ours, so no NeoX-specific split table is needed) and upcast bf16/fp16 to the model dtype.
The config is NeoX's own YAML, copied by NeoX into global_stepN/configs/; our loader reads the
paper's 2022 files unchanged.
"""
from __future__ import annotations

import os
import re

import torch

from megatron.checkpoint import safe_load
from megatron.checkpoint.client import CHECKED_ARGS, client_state
from megatron.checkpoint.compat import differences
from megatron.checkpoint.errors import CheckpointError
from megatron.checkpoint.layout import DESCRIPTIONS, config_files, layer_files, shard_files
from megatron.checkpoint.neox_keys import our_key
from megatron.config import load_config
from megatron.model import GPTModel
from megatron.parallel.merge import merge_plan, merge_state_dicts

# Buffers fully determined by the config: recomputed in fp32 rather than taken from a bf16 copy.
DERIVED_BUFFERS = ("position.inv_freq", "position.slopes")


def read_config(tag_dir: str, files=None, overrides: dict | None = None):
    files = list(files or config_files(tag_dir))
    if not files:
        raise CheckpointError(f"{tag_dir} has no configs/*.yml (NeoX copies the training YAML there); "
                              "pass the training config with --config")
    # The merged model is single-rank and sequential, whatever it was trained with.
    over = {"model_parallel_size": 1, "pipe_parallel_size": 0, **(overrides or {})}
    return load_config(files, over)


def _raw_shards(tag_dir: str, layout: str, trust: bool, allow_nonfinite: bool) -> tuple[list[dict], dict]:
    """Per TP rank {(neox idx, key): (tensor, file name)}, and rank 0's client state."""
    def read(path: str) -> dict:
        return safe_load.read_checkpoint_file(path, trust, allow_nonfinite)

    mps = shard_files(tag_dir)
    blobs = [read(p) for p in mps] if layout == "neox-sequential" else []
    client = client_state(blobs[0] if blobs else (read(mps[0]) if mps else {}))
    if layout == "neox-pipeline":
        by_rank: dict[int, dict] = {}
        for (tp, idx), path in sorted(layer_files(tag_dir).items()):
            name = os.path.basename(path)
            for key, t in read(path).items():
                by_rank.setdefault(tp, {})[(idx, key)] = (t, name)
        return [by_rank[r] for r in sorted(by_rank)], client
    shards = []
    for path, blob in zip(mps, blobs, strict=True):
        if blob.get("module") is None:
            raise CheckpointError(f"{path} has module None but no layer_XX-model_YY files sit next to it: "
                                  "the pipeline layer files are missing")
        shard = {}
        for k, t in blob["module"].items():
            m = re.fullmatch(r"sequential\.(\d+)\.(.+)", k)
            if m is None:
                raise CheckpointError(f"{path}: key {k!r} is not 'sequential.<idx>.<param>'; not a NeoX sequential checkpoint")
            shard[(int(m.group(1)), m.group(2))] = (t, os.path.basename(path))
        shards.append(shard)
    return shards, client


def _rename(raw: dict, num_layers: int) -> tuple[dict, dict]:
    """{our key: tensor} and {our key: 'file key'} for one rank; replicas must agree."""
    state, where = {}, {}
    for (idx, key), (t, fname) in sorted(raw.items()):
        try:
            ours = our_key(idx, key, num_layers)
        except ValueError as e:
            raise CheckpointError(f"{fname}: {e}") from e
        if ours is None:
            continue
        if ours in state:  # the shared scheme in every layer, or a tied embedding written twice
            if state[ours].shape != t.shape or not torch.equal(state[ours], t):
                raise CheckpointError(f"{fname}: {key} differs from the copy in {where[ours]}; the shared "
                                      "positional parameters must be identical in every layer")
            continue
        state[ours], where[ours] = t, f"{fname} key {key!r}"
    return state, where


def _refuse_another_block(tag_dir: str, client: dict, cfg) -> None:
    """NeoX saves its arguments in the client state: a config that describes another block than the
    one trained (gpt-j-residual dropped, another activation, ...) would load every tensor and be a
    different model, so it is refused naming each key."""
    args = client.get("args")
    if not isinstance(args, dict):
        return
    saved = {k: args.get(k) for k in CHECKED_ARGS if k in args}
    if "num_kv_heads" in saved:
        saved["num_attention_heads"] = args.get("num_attention_heads")
    current = {k: getattr(cfg.model, k) for k in CHECKED_ARGS}
    bad = differences(saved, current, CHECKED_ARGS)
    if bad:
        raise CheckpointError(f"{tag_dir}: the checkpoint's saved arguments describe another model than the config: "
                              f"{'; '.join(bad)}. Use the checkpoint's own configs (global_stepN/configs/), or set "
                              "these keys to the checkpoint's values")


def _check_shapes(shards: list[dict], wheres: list[dict], expected: dict, plan, tag_dir: str) -> None:
    """Every rank holds exactly the expected keys with its 1/tp slice of each split dim
    (`plan`: megatron.parallel.merge.MergePlan of the model the config describes)."""
    tp = len(shards)
    for rank, (state, where) in enumerate(zip(shards, wheres, strict=True)):
        missing = sorted(set(expected) - set(state))
        if missing:
            raise CheckpointError(f"{tag_dir} (tensor-parallel rank {rank}): no tensor for {missing[:6]} "
                                  "of the model its config describes; is a layer file missing?")
        for key, t in state.items():
            if key not in expected:
                raise CheckpointError(f"{tag_dir}: {where[key]} maps to {key!r}, which the model its config "
                                      "describes does not have (check pos-emb / no-weight-tying in the config)")
            shape = list(expected[key])
            dim = plan.dim_of(key)
            if dim is not None:
                shape[dim] //= tp
            if list(t.shape) != shape:
                raise CheckpointError(f"{tag_dir}: {where[key]} ({key}): expected shape {tuple(shape)}"
                                      f"{f' (1/{tp} of {tuple(expected[key])})' if dim is not None and tp > 1 else ''}, "
                                      f"found {tuple(t.shape)}")


def _merge(shards: list[dict], plan, tag_dir: str) -> dict:
    if len(shards) == 1:
        return dict(shards[0])

    try:
        merged = merge_state_dicts(shards, plan)
    except ValueError as e:
        raise CheckpointError(f"{tag_dir}: cannot merge its {len(shards)} tensor-parallel shards: {e}") from e
    return merged


def _finish(state: dict, model, dtype: torch.dtype, tag_dir: str) -> dict:
    """Upcast to the model dtype; recompute config-determined buffers in fp32 after checking the
    stored copy agrees (a bf16 copy of inv_freq would shift long-range rotary angles)."""
    fresh = model.state_dict()
    out = {}
    for key, t in state.items():
        if key in DERIVED_BUFFERS:
            ref = fresh[key].float()
            if not torch.allclose(t.float().reshape(ref.shape), ref, rtol=1e-2, atol=1e-6):
                raise CheckpointError(f"{tag_dir}: stored {key} does not match the one the config implies "
                                      "(rotary-pct / rotary-emb-base / num-attention-heads differ?)")
            out[key] = ref
        else:
            out[key] = t.to(dtype) if t.is_floating_point() else t
    return out


def read_neox_state(tag_dir: str, layout: str, config=None, overrides: dict | None = None,
                    trust: bool = False, dtype: torch.dtype = torch.float32,
                    allow_nonfinite: bool = False) -> tuple[dict, dict, object, int]:
    """(our TP=1 state dict in `dtype`, client state with args.padded_vocab_size, NeoXConfig with
    TP=1 and no pipeline, padded vocab size) of one NeoX step directory. `config`: YAML files to use
    instead of global_stepN/configs/. `trust`: allow the full unpickler (see safe_load.py).
    `allow_nonfinite`: accept NaN/inf tensors (see finite.py)."""
    cfg = read_config(tag_dir, config, overrides)
    raw, client = _raw_shards(tag_dir, layout, trust, allow_nonfinite)
    _refuse_another_block(tag_dir, client, cfg)
    L = cfg.model.num_layers
    renamed = [_rename(r, L) for r in raw]
    shards, wheres = [s for s, _ in renamed], [w for _, w in renamed]
    emb = shards[0].get("word_embeddings.weight")
    if emb is None:
        raise CheckpointError(f"{tag_dir}: no word_embeddings.weight (NeoX layer 0); is layer_00 missing?")
    vocab = emb.shape[0] * len(shards)
    saved_vocab = (client.get("args") or {}).get("padded_vocab_size")
    if saved_vocab is not None and saved_vocab != vocab:
        raise CheckpointError(f"{tag_dir}: embedding has {vocab} rows over {len(shards)} shards but args."
                              f"padded_vocab_size is {saved_vocab}")
    # One meta-device model (no memory) says both: every tensor's full shape, and (the plan of its
    # layers, read by the same names after neox_keys.py renamed NeoX's) which dim the TP shards split.
    with torch.device("meta"):
        described = GPTModel(cfg.model, vocab)
    expected = {k: tuple(v.shape) for k, v in described.state_dict().items()}
    try:
        plan = merge_plan(described)
    except ValueError as e:
        raise CheckpointError(f"{tag_dir}: {e}") from e
    _check_shapes(shards, wheres, expected, plan, tag_dir)
    state = _merge(shards, plan, tag_dir)
    model = GPTModel(cfg.model, vocab)
    state = _finish(state, model, dtype, tag_dir)
    merged_note = f", {len(shards)} tensor-parallel shards merged" if len(shards) > 1 else ""
    print(f"[checkpoint] read {tag_dir} as {DESCRIPTIONS[layout]}{merged_note}", flush=True)
    client = {**client, "args": {**(client.get("args") or {}), "padded_vocab_size": vocab}}
    return state, client, cfg, vocab
