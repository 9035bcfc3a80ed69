"""NeoX checkpoints of NeoX's other block shapes: a Pythia-style model (parallel residual, tanh
GELU) written in NeoX's layouts loads with the same logits, and a config that describes another
block than the checkpoint's saved arguments (the user who deletes gpt-j-residual) is refused
naming the key, instead of loading every tensor into a different model."""
import os

import pytest
import torch
import yaml

from tests.integration.test_neox_interop import reference_model, rounded_copy, tiny_neox_config, write_neox_checkpoint

PYTHIA = {"gpt-j-residual": True, "bias-gelu-fusion": True, "pos-emb": "rotary", "rotary-pct": 0.25}


@pytest.mark.parametrize("layout,tp", [("sequential", 1), ("sequential", 2), ("pipeline", 1)])
def test_a_pythia_style_checkpoint_loads_as_itself(tmp_path, layout, tp):
    from megatron.checkpoint.load_model import load_checkpoint_model

    cfg = tiny_neox_config(**PYTHIA)
    model = reference_model(tmp_path, cfg)
    ck = write_neox_checkpoint(tmp_path / "ck", model, cfg, layout, tp)
    loaded, lcfg, _ = load_checkpoint_model(ck)
    assert lcfg.model.gpt_j_residual and lcfg.model.bias_gelu_fusion
    tokens = torch.randint(0, 128, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens), rounded_copy(model)(tokens), rtol=0, atol=0)


def _saved_args(ck: str, **args) -> str:
    """Put NeoX's own arguments into the checkpoint's client state, as NeoX saves them."""
    tag = os.path.join(ck, "global_step10")
    path = os.path.join(tag, "mp_rank_00_model_states.pt")
    blob = torch.load(path, weights_only=False)
    blob["args"] = {**blob["args"], **args}
    torch.save(blob, path)
    return tag


def test_a_config_without_the_checkpoint_s_block_is_refused(tmp_path):
    from megatron.checkpoint.errors import CheckpointError
    from megatron.checkpoint.load_model import load_checkpoint_model

    cfg = tiny_neox_config(**PYTHIA)
    ck = write_neox_checkpoint(tmp_path / "ck", reference_model(tmp_path, cfg), cfg, "sequential", 1)
    tag = _saved_args(ck, gpt_j_residual=True, bias_gelu_fusion=True, activation="gelu")
    stripped = {k: v for k, v in cfg.items() if k not in ("gpt-j-residual",)}  # the key a user deletes
    with open(os.path.join(tag, "configs", "kerple.yml"), "w") as f:
        yaml.safe_dump(stripped, f)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint_model(ck)
    assert "gpt-j-residual: checkpoint True, config False" in str(e.value)
    assert "bias-gelu-fusion" not in str(e.value)  # only what differs


def test_saved_arguments_of_the_same_block_load(tmp_path):
    """NeoX writes num_kv_heads null for multi-head attention: equal to every head."""
    from megatron.checkpoint.load_model import load_checkpoint_model

    cfg = tiny_neox_config(**PYTHIA)
    ck = write_neox_checkpoint(tmp_path / "ck", reference_model(tmp_path, cfg), cfg, "sequential", 1)
    _saved_args(ck, gpt_j_residual=True, gpt_j_tied=False, num_kv_heads=None, activation="gelu", norm="layernorm")
    loaded, _, _ = load_checkpoint_model(ck)
    assert loaded.layers[0].parallel_residual
