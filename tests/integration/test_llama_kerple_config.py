"""The shipped Llama-style KERPLE overlay (configs/quickstart_llama_kerple.yml): it loads as the
block it says (RMSNorm, SwiGLU at NeoX's widths, grouped-query attention, no biases, kerple_log),
and on top of the suite's tiny model it trains through the DeepSpeed engine on CPU with a falling
loss, and its checkpoint loads back for evaluation as the same model."""
import os

import torch

from megatron.config import load_config
from tests.conftest import ROOT, train_config_dict, write_yaml

OVERLAY = os.path.join(ROOT, "configs", "quickstart_llama_kerple.yml")


def test_the_overlay_is_a_llama_block_with_kerple():
    cfg = load_config([os.path.join(ROOT, "configs", "quickstart.yml"), OVERLAY]).model
    assert (cfg.norm, cfg.activation, cfg.pos_emb, cfg.kv_heads) == ("rmsnorm", "swiglu", "kerple_log", 2)
    assert not (cfg.use_bias_in_attn_linear or cfg.use_bias_in_mlp or cfg.use_bias_in_norms)
    assert cfg.mlp_widths == (704, 352) and cfg.grouped_query and not cfg.gpt_j_residual


def test_the_overlay_trains_and_its_checkpoint_loads(tmp_path, token_dataset):
    from megatron.checkpoint.load_model import load_checkpoint_model
    from megatron.training.trainer import Trainer

    base = train_config_dict(tmp_path, token_dataset, train_iters=30, lr_decay_style="constant",
                             optimizer={"type": "Adam", "params": {"lr": 0.01, "betas": [0.9, 0.99], "eps": 1e-8}},
                             save=str(tmp_path / "ck"), save_interval=30)
    cfg = load_config([write_yaml(tmp_path / "base.yml", base), OVERLAY,
                       write_yaml(tmp_path / "here.yml", {"run-dir": str(tmp_path / "run")})])
    assert (cfg.model.activation, cfg.model.num_layers, cfg.model.kv_heads) == ("swiglu", 2, 2)
    trainer = Trainer(cfg)
    losses, log = [], trainer.log.log_step
    trainer.log.log_step = lambda it, metrics, *rest: (losses.append(metrics["lm_loss"]), log(it, metrics, *rest))
    trainer.train()
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.5, losses

    model, loaded, _ = load_checkpoint_model(str(tmp_path / "ck"))
    assert loaded.model.activation == "swiglu" and loaded.model.kv_heads == 2
    qkv = model.layers[0].attention.query_key_value.weight
    assert qkv.shape[0] == 32 + 2 * 2 * 8  # [Q | K | V]: 4 query heads, 2 key/value heads of 8
    tokens = torch.randint(1, 100, (1, 16))
    with torch.no_grad():
        assert torch.isfinite(model(tokens)).all()
