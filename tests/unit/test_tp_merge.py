"""The tensor-parallel merge rules on synthetic state dicts: split a TP=1 state dict the way the
TP layers hold it, merge it back, get the original (and clear errors for what cannot merge)."""
import pytest
import torch

from megatron.config.model import ModelConfig
from megatron.model import GPTModel
from megatron.parallel.layout import scheme_dims
from megatron.parallel.merge import merge_rule, merge_state_dicts


def full_state(h=8, heads=4, vocab=16, buckets=6):
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)
    return {
        "word_embeddings.weight": r(vocab, h), "output_layer.weight": r(vocab, h),
        "layers.0.input_layernorm.weight": r(h), "layers.0.input_layernorm.bias": r(h),
        "layers.0.attention.query_key_value.weight": r(3 * h, h), "layers.0.attention.query_key_value.bias": r(3 * h),
        "layers.0.attention.dense.weight": r(h, h), "layers.0.attention.dense.bias": r(h),
        "layers.0.post_attention_layernorm.weight": r(h), "layers.0.post_attention_layernorm.bias": r(h),
        "layers.0.mlp.dense_h_to_4h.weight": r(4 * h, h), "layers.0.mlp.dense_h_to_4h.bias": r(4 * h),
        "layers.0.mlp.dense_4h_to_h.weight": r(h, 4 * h), "layers.0.mlp.dense_4h_to_h.bias": r(h),
        "final_norm.weight": r(h), "final_norm.bias": r(h),
        "position.bias_p": r(heads, 1, 1), "position.bias_a": r(heads, 1, 1),
    }


def split(state, tp, pos_emb):
    shards = [{} for _ in range(tp)]
    for k, v in state.items():
        dim = merge_rule(k, pos_emb)
        parts = [v] * tp if dim is None else v.chunk(tp, dim=dim)
        for r in range(tp):
            shards[r][k] = parts[r].clone()
    return shards


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_split_then_merge_is_identity(tp):
    state = full_state()
    merged = merge_state_dicts(split(state, tp, "kerple_log"), "kerple_log")
    assert set(merged) == set(state)
    for k in state:
        assert torch.equal(merged[k], state[k]), k


def test_rules_by_role():
    assert merge_rule("layers.3.attention.query_key_value.weight", "rotary") == 0
    assert merge_rule("layers.3.attention.dense.weight", "rotary") == 1
    assert merge_rule("layers.3.attention.dense.bias", "rotary") is None
    assert merge_rule("layers.3.mlp.dense_4h_to_h.weight", "rotary") == 1
    assert merge_rule("layers.3.mlp.dense_h_to_4h.bias", "rotary") == 0
    assert merge_rule("word_embeddings.weight", "rotary") == 0
    assert merge_rule("final_norm.weight", "rotary") is None


def positional_shard_dims(pos_emb: str) -> dict:
    cfg = ModelConfig(num_layers=1, hidden_size=32, num_attention_heads=4, seq_length=16, pos_emb=pos_emb)
    return scheme_dims(GPTModel(cfg, 64).position)


def test_positional_dims_come_from_the_schemes():
    assert positional_shard_dims("kerple_log") == {"bias_p": 0, "bias_a": 0}
    assert positional_shard_dims("kerple_power_ap_ap") == {"bias_p": 0, "bias_a": 0, "wei_p": 0, "wei_a": 0}
    assert positional_shard_dims("alibi") == {"slopes": 0}
    assert positional_shard_dims("rpe") == {"weight": 1}  # T5 table [buckets, H]
    assert positional_shard_dims("rotary") == {"inv_freq": None}
    assert positional_shard_dims("learned") == {"weight": None}


def test_t5_table_merges_along_heads():
    table = torch.randn(6, 4)
    merged = merge_state_dicts([{"position.weight": table[:, :2]}, {"position.weight": table[:, 2:]}], "rpe")
    assert torch.equal(merged["position.weight"], table)


def test_replicated_tensors_must_agree():
    a = {"final_norm.weight": torch.ones(4)}
    b = {"final_norm.weight": torch.ones(4) * 2}
    with pytest.raises(ValueError, match="identical on every tensor-parallel rank"):
        merge_state_dicts([a, b], "kerple_log")


def test_unknown_key_and_extra_state():
    with pytest.raises(ValueError, match="no tensor-parallel merge rule"):
        merge_state_dicts([{"foo.weight": torch.ones(1)}] * 2, "kerple_log")
    with pytest.raises(ValueError, match="not a tensor of pos-emb"):
        merge_state_dicts([{"position.bias_p": torch.ones(1, 1, 1)}] * 2, "rotary")
    merged = merge_state_dicts([{"layers.0.attention.dense._extra_state": None,
                                 "final_norm.weight": torch.ones(2)}] * 2, "kerple_log")
    assert list(merged) == ["final_norm.weight"]
