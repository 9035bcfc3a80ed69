"""Fine-tuning from a released model: a Hugging Face model imported (tools/import_hf.py) starts a
training run with `load:` + `finetune: true` that trains, saves and resumes exactly; the context
extension recipes start from it at twice its length: RoPE scaling (yarn) on the same weights, or
its rotary replaced by KERPLE (finetune-new-pos-emb: every other tensor loaded, KERPLE's
parameters from their initial values)."""
import os

import pytest
import torch
import yaml

from megatron.config import load_config
from tests.conftest import write_yaml
from tests.integration.test_hf_import import import_here, save_hf

transformers = pytest.importorskip("transformers")


def finetune_cfg(tmp_path, imported: str, dataset: str, name: str, **over) -> str:
    """The imported checkpoint's own resolved config, then a training section (docs/interop.md's recipe)."""
    train = {"load": imported, "finetune": True, "data-path": dataset, "tokenizer-type": "CharLevelTokenizer",
             "split": "80,10,10", "train-iters": 6, "train_micro_batch_size_per_gpu": 2, "seq-length": 32,
             "optimizer": {"type": "Adam", "params": {"lr": 0.003, "betas": [0.9, 0.99], "eps": 1e-8}},
             "lr-decay-style": "constant", "eval-interval": 1000, "eval-iters": 1, "log-interval": 1,
             "num-workers": 0, "run-dir": str(tmp_path / name), "checkpoint-factor": 3, "save": str(tmp_path / f"{name}_ck"),
             **over}
    return [os.path.join(imported, "global_step0", "resolved_config.yml"), write_yaml(tmp_path / f"{name}.yml", train)]


def train(paths, **over):
    from megatron.training.trainer import Trainer

    cfg = load_config(paths, over or None)
    trainer = Trainer(cfg)
    losses, log = [], trainer.log.log_step
    trainer.log.log_step = lambda it, metrics, *rest: (losses.append((it, metrics["lm_loss"])), log(it, metrics, *rest))
    trainer.train()
    return losses, trainer


@pytest.fixture
def imported(tmp_path):
    _, src = save_hf(tmp_path, "pythia")
    out = str(tmp_path / "imported")
    import_here(src, out)
    return out


def test_finetune_from_an_imported_model_resumes_exactly(tmp_path, imported, token_dataset):
    full, _ = train(finetune_cfg(tmp_path, imported, token_dataset, "full"))
    half_paths = finetune_cfg(tmp_path, imported, token_dataset, "half", **{"exit-interval": 3})
    train(half_paths)
    ck = str(tmp_path / "half_ck")
    assert open(os.path.join(ck, "latest")).read().strip() == "global_step3"
    resumed, _ = train(half_paths, load=ck, finetune=False, exit_interval=None)
    assert [it for it, _ in resumed] == [4, 5, 6]
    for it, loss in resumed:
        assert loss == pytest.approx(dict(full)[it], abs=1e-6), (it, loss)


def test_context_extension_with_yarn_keeps_every_weight(tmp_path, imported, token_dataset):
    losses, trainer = train(finetune_cfg(tmp_path, imported, token_dataset, "yarn", **{
        "seq-length": 64, "max-position-embeddings": 64, "rotary-scaling": "yarn", "rotary-scaling-factor": 2.0,
        "rotary-scaling-original-length": 32}))
    assert len(losses) == 6 and all(torch.isfinite(torch.tensor(v)) for _, v in losses)
    assert trainer.cfg.model.pos_emb == "rotary" and trainer.cfg.model.rotary_scaling == "yarn"


def test_context_extension_by_swapping_rotary_for_kerple(tmp_path, imported, token_dataset, capsys):
    from megatron.checkpoint.load_model import load_checkpoint_model

    paths = finetune_cfg(tmp_path, imported, token_dataset, "kerple", **{
        "pos-emb": "kerple_log", "finetune-new-pos-emb": True, "seq-length": 64, "max-position-embeddings": 64})
    losses, _ = train(paths)
    out = capsys.readouterr().out
    assert "pos-emb rotary -> kerple_log" in out and "position.bias_p" in out
    assert len(losses) == 6
    model, cfg, _ = load_checkpoint_model(str(tmp_path / "kerple_ck"))
    base, _, _ = load_checkpoint_model(imported)
    assert cfg.model.pos_emb == "kerple_log"
    # every non-positional tensor started from the imported weights: the embedding moved only by training
    moved = (model.word_embeddings.weight - base.word_embeddings.weight).abs().max().item()
    assert 0 < moved < 0.1


def test_finetune_new_pos_emb_refuses_a_no_op(tmp_path, imported, token_dataset):
    from megatron.checkpoint.errors import CheckpointError

    paths = finetune_cfg(tmp_path, imported, token_dataset, "same", **{"finetune-new-pos-emb": True})
    with pytest.raises(CheckpointError, match="remove finetune-new-pos-emb"):
        train(paths)
    with open(paths[1]) as f:
        bad = {k: v for k, v in yaml.safe_load(f).items() if k != "finetune"}
    from megatron.config import ConfigError

    with pytest.raises(ConfigError, match="needs finetune: true"):
        load_config([paths[0], write_yaml(tmp_path / "bad.yml", bad)])
