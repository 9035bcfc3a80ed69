"""Batch sizes are computed once, in the open: building the engine returns what it built (engine,
model, parallel context) instead of setting the trainer's batch fields as a side effect."""
import deepspeed

from megatron.config import load_config
from tests.conftest import train_config_dict, write_yaml


def test_build_engine_returns_its_products_and_sets_no_batch_fields(tmp_path, token_dataset):
    from megatron.training.trainer import Trainer

    cfg = load_config([write_yaml(tmp_path / "b.yml", train_config_dict(
        tmp_path, token_dataset, train_iters=1, gradient_accumulation_steps=2))])
    trainer = Trainer(cfg)
    try:
        assert (trainer.batch, trainer.micro, trainer.gas) == cfg.training.batch_sizes(trainer.par.dp_size)
        assert trainer.gas == 2
        fresh = Trainer.__new__(Trainer)  # the same inputs _setup gives it, nothing else
        fresh.cfg, fresh.par, fresh.pipe, fresh.vocab_size = cfg, trainer.par, trainer.pipe, trainer.vocab_size
        engine, model, parallel = fresh._build_engine(deepspeed)
        assert model is engine.module and parallel.dp_size == trainer.par.dp_size
        assert not {"batch", "micro", "gas", "engine", "model"} & set(vars(fresh))
    finally:
        trainer.release()
