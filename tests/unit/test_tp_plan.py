"""The tensor-parallel plan (megatron/parallel/plan.py): every tensor of GPTModel has the dim its TP
shards split, the merge reads the same plan (off a meta-device model of the checkpoint's config), a
positional scheme's split is what it declares, and a tensor or key the plan cannot account for is
an error naming it, never a guess from its name."""
import dataclasses

import pytest
import torch
from torch import nn

from megatron.checkpoint.errors import CheckpointError
from megatron.checkpoint.tp_merge import merge_blobs
from megatron.config.model import ModelConfig
from megatron.model import GPTModel
from megatron.parallel.layout import scheme_dims
from megatron.parallel.merge import merge_plan, merge_rule, merge_state_dicts
from megatron.parallel.plan import scheme_shard, shard_dims
from megatron.positional import registry
from megatron.positional.base import positional_spec

BASE = ModelConfig(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, pos_emb="kerple_log")
CONFIGS = {
    "kerple_log-tied": {},
    "kerple_log-untied": {"no_weight_tying": True},
    "rotary": {"pos_emb": "rotary", "rotary_pct": 0.5},
    "rpe": {"pos_emb": "rpe", "rpe_num_buckets": 6, "rpe_max_distance": 12},
    "alibi": {"pos_emb": "alibi"},
    "learned": {"pos_emb": "learned"},
    "sinusoidal": {"pos_emb": "sinusoidal"},
    "kerple_power_ap_ap": {"pos_emb": "kerple_power_ap_ap"},
    "rmsnorm-no-bias": {"norm": "rmsnorm", "use_bias_in_attn_linear": False, "use_bias_in_mlp": False,
                        "no_weight_tying": True},
}

# The positional tensors split over heads, by the dim holding the heads: KERPLE/ALiBi (H, 1, 1),
# T5 (buckets, H); rotary/sinusoidal frequencies and the learned table are the same on every rank.
POSITION_SPLIT = {"bias_p": 0, "bias_a": 0, "wei_p": 0, "wei_a": 0, "slopes": 0}


def expected_split(key: str, pos_emb: str) -> int | None:
    """Megatron-LM's layout (Shoeybi et al. 2019, sec. 3), weights stored [out, in]: QKV and
    h->4h are column-parallel (output rows, and their biases), attention dense and 4h->h
    row-parallel (input columns; their bias is added once, after the all-reduce, so it is whole),
    the embedding and output layer split the vocabulary rows, norms are whole on every rank."""
    *_, module, param = key.split(".")
    if key.startswith("position."):
        return 1 if pos_emb == "rpe" else POSITION_SPLIT.get(param)
    if module in ("query_key_value", "dense_h_to_4h", "word_embeddings", "output_layer"):
        return 0
    if module in ("dense", "dense_4h_to_h"):
        return 1 if param == "weight" else None
    assert "norm" in module, key
    return None


def model_cfg(name: str) -> ModelConfig:
    return dataclasses.replace(BASE, **CONFIGS[name])


@pytest.mark.parametrize("name", CONFIGS)
def test_every_gpt_tensor_carries_its_split_and_the_merge_uses_it(name):
    cfg = model_cfg(name)
    torch.manual_seed(0)
    model = GPTModel(cfg, 64)
    state, dims = model.state_dict(), shard_dims(model)
    assert set(dims) == set(state)
    by_config, by_scheme = merge_plan(cfg), merge_plan(cfg.pos_emb)  # what merge_state_dicts reads
    for key in state:
        assert dims[key] == expected_split(key, cfg.pos_emb), key
        assert by_config.dim_of(key) == dims[key], key  # the meta-device model of the config
        assert by_scheme.dim_of(key) == dims[key], key  # the scheme's reference model
        assert merge_rule(key, cfg.pos_emb) == dims[key], key
    assert ("output_layer.weight" in state) == cfg.no_weight_tying
    if cfg.pos_emb != "none":
        assert any(k.startswith("position.") for k in state)


@pytest.mark.parametrize("pos_emb", registry.scheme_names())
def test_every_registered_scheme_declares_the_split_it_builds(pos_emb):
    """A scheme's split is what it declares (head_dims), with no entry anywhere else; and what it
    builds for a rank's heads is exactly the whole scheme's slices along those dims."""
    cfg = dataclasses.replace(BASE, pos_emb=pos_emb)
    torch.manual_seed(0)
    model = GPTModel(cfg, 64)
    dims = shard_dims(model)
    position = {k: d for k, d in dims.items() if k.startswith("position.")}
    assert position == {f"position.{k}": d for k, d in scheme_dims(model.position).items()}
    assert dims == merge_plan(cfg).dims
    spec = positional_spec(cfg)
    for rank in range(2):
        torch.manual_seed(1)
        whole = registry.build_scheme(pos_emb, spec)
        torch.manual_seed(1)
        direct = registry.build_scheme(pos_emb, dataclasses.replace(spec, tp_rank=rank, tp_size=2))
        local = scheme_shard(whole, rank, 2)
        assert local.state_dict().keys() == direct.state_dict().keys()
        for key, t in direct.state_dict().items():
            assert torch.equal(local.state_dict()[key], t), (rank, key)


@pytest.mark.parametrize("name", ["kerple_log-tied", "rpe", "rmsnorm-no-bias"])
def test_saved_tp_shards_merge_back_by_the_saved_config(name):
    """ours-tp: split a TP=1 state the way its tags say, save it as the Checkpointer would
    (client state with the flat config), merge: the original, bit for bit."""
    cfg = model_cfg(name)
    torch.manual_seed(0)
    model = GPTModel(cfg, 64)
    tp, dims = 2, shard_dims(model)
    shards = [{} for _ in range(tp)]
    for key, t in model.state_dict().items():
        dim = dims[key]
        parts = [t] * tp if dim is None else t.chunk(tp, dim=dim)
        for r in range(tp):
            shards[r][key] = parts[r].detach().clone()
    flat = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    client = {"iteration": 3, "args": {"pos_emb": cfg.pos_emb, "model_parallel_size": tp},
              "config": {**flat, "model_parallel_size": tp}}
    merged, merged_client = merge_blobs([{"module": s, **client} for s in shards], "step3")
    assert merged.keys() == model.state_dict().keys()
    for key, t in model.state_dict().items():
        assert torch.equal(merged[key], t), key
    assert merged_client["args"]["model_parallel_size"] == 1
    assert merged_client["config"]["model_parallel_size"] == 1


def test_saved_config_rejects_a_key_its_model_lacks():
    """A tied model has no output layer: a shard holding one belongs to another model. The name
    alone used to be enough to concatenate it along dim 0."""
    cfg = model_cfg("kerple_log-tied")
    flat = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    blob = {"module": {"output_layer.weight": torch.ones(2, 4)}, "args": {"pos_emb": "kerple_log"}, "config": flat}
    with pytest.raises(CheckpointError, match=r"'output_layer\.weight'.*the GPTModel its config describes"):
        merge_blobs([blob, blob], "step3")


@pytest.mark.parametrize("key", ["layers.0.mlp.output_layer.weight", "layers.1.attention.extra_layernorm.weight",
                                 "layers.0.attention.gate.query_key_value.weight"])
def test_a_known_looking_name_the_model_lacks_is_an_error(key):
    """Names that end like a known layer but are no tensor of GPTModel: an error naming the key,
    not a split guessed from the name (the old regexes gave dim 0, REPLICATED, dim 0)."""
    with pytest.raises(ValueError, match="no tensor-parallel merge rule for checkpoint key") as err:
        merge_state_dicts([{key: torch.ones(4, 4)}, {key: torch.ones(4, 4)}], "kerple_log")
    assert repr(key) in str(err.value)


def test_a_new_layer_without_a_plan_entry_is_an_error_naming_it(monkeypatch):
    """A layer added to the model without a style in the plan (here a square projection named like the
    output layer, which any dim would concatenate without complaint) stops the merge, naming it."""
    from megatron.model import transformer  # the block's file, the MLP's home

    built = transformer.MLP.__init__

    def with_gate(self, model_cfg, *args, **kwargs):
        built(self, model_cfg, *args, **kwargs)
        self.output_layer = nn.Linear(model_cfg.hidden_size, model_cfg.hidden_size, bias=False)

    monkeypatch.setattr(transformer.MLP, "__init__", with_gate)
    cfg = model_cfg("kerple_log-untied")
    key = "layers.0.mlp.output_layer.weight"
    for source in (cfg, GPTModel(cfg, 64)):
        with pytest.raises(ValueError, match=r"without a tensor-parallel rule: \[.*'layers\.0\.mlp\.output_layer\.weight'"):
            merge_state_dicts([{key: torch.ones(32, 32)}] * 2, source)


def test_shard_dims_lists_every_tensor_without_a_rule():
    model = GPTModel(model_cfg("kerple_log-tied"), 64)
    model.extra = nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"\['extra\.weight', 'extra\.bias'\]"):
        shard_dims(model)


def test_building_the_meta_model_leaves_the_rng_alone():
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    merge_plan(model_cfg("rpe"))
    assert torch.equal(torch.rand(3), expected)


def test_a_scheme_reading_its_options_gets_them_on_every_rank(monkeypatch):
    """A scheme's hyperparameters arrive as spec.options (one ModelConfig field each): a rank's
    copy of it is built with the model's options, not without."""
    from megatron.positional.base import PositionalScheme

    class PerLayerHeads(PositionalScheme):
        head_dims = {"scale": 0}

        def __init__(self, spec):
            super().__init__(spec)
            depth = spec.options["num_layers"]  # a KeyError without the options
            self.scale = nn.Parameter(torch.full((spec.local_heads, depth), 0.5))

    monkeypatch.setitem(registry._REGISTRY, "per_layer_heads", PerLayerHeads)
    cfg = dataclasses.replace(BASE, pos_emb="per_layer_heads", num_layers=3)
    model = GPTModel(cfg, 64)
    assert shard_dims(model)["position.scale"] == 0
    assert merge_plan(cfg).dim_of("position.scale") == 0
    assert scheme_shard(model.position, 1, 2).scale.shape == (2, 3)


@pytest.mark.parametrize("declared,says", [({"pairs": 0}, "heads along dim 0"), ({}, "whole on every rank")])
def test_a_scheme_whose_rank_copy_is_not_its_declared_slice_is_refused_naming_it(monkeypatch, declared, says):
    """A tensor split in two dims, or a per-head tensor not declared: sharding the scheme for a
    rank stops, naming the scheme, the tensor, both shapes and what the declaration says."""
    from megatron.positional.base import PositionalScheme

    class HeadPairs(PositionalScheme):
        head_dims = declared

        def __init__(self, spec):
            super().__init__(spec)
            self.pairs = nn.Parameter(torch.zeros(spec.local_heads, spec.local_heads))

    monkeypatch.setitem(registry._REGISTRY, "head_pairs", HeadPairs)
    model = GPTModel(dataclasses.replace(BASE, pos_emb="head_pairs"), 64)  # whole: nothing to check yet
    with pytest.raises(ValueError, match=r"pos-emb 'head_pairs' tensor 'pairs' is \(4, 4\) for 4 heads and "
                                         rf"\(2, 2\) for a rank's 2 of them, but its head_dims say {says}"):
        scheme_shard(model.position, 0, 2)
