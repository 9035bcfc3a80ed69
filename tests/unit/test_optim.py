"""NeoX parameter groups: norms and `bias` parameters get no weight decay."""
from megatron.model import GPTModel
from megatron.training.optim import param_groups


def test_groups_split_norms_and_biases(tiny_config):
    cfg = tiny_config()
    model = GPTModel(cfg.model, 128)
    groups = param_groups(model, 0.1)
    decay = {id(p) for p in groups[0]["params"]}
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[i] for i in decay}
    assert groups[0]["weight_decay"] == 0.1 and groups[1]["weight_decay"] == 0.0
    assert "layers.0.attention.query_key_value.weight" in decayed
    assert "position.bias_p" in decayed  # as in the paper's NeoX fork: named bias_p, not bias
    assert not any(n.endswith(".bias") or "layernorm" in n or "final_norm" in n for n in decayed)
    total = sum(len(g["params"]) for g in groups)
    assert total == len(list(model.parameters()))


def test_single_group_without_weight_decay(tiny_config):
    model = GPTModel(tiny_config().model, 128)
    groups = param_groups(model, 0.0)
    assert len(groups) == 1 and groups[0]["weight_decay"] == 0.0
