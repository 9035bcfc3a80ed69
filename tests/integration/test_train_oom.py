"""Out of memory in a training step ends in one OutOfMemory naming the length, the micro batch
and the fixes, for CUDA's error and for the CPU allocator's RuntimeError alike."""
import pytest
import torch

from megatron.config import load_config
from megatron.errors import OutOfMemory
from tests.conftest import train_config_dict, write_yaml

CPU_OOM = RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
                       "you tried to allocate 274877906944 bytes. Error code 12 (Cannot allocate memory)")


@pytest.mark.parametrize("error", [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"), CPU_OOM],
                         ids=["cuda", "cpu"])
def test_oom_in_a_training_step_names_the_shape_and_the_fix(tmp_path, token_dataset, monkeypatch, error):
    from megatron.training.trainer import Trainer

    cfg = load_config([write_yaml(tmp_path / "oom.yml", train_config_dict(tmp_path, token_dataset, train_iters=2))])
    trainer = Trainer(cfg)

    def forward(*args, **kwargs):
        raise error

    monkeypatch.setattr(trainer.model, "forward", forward)
    with pytest.raises(OutOfMemory) as err:
        trainer.train()
    message = str(err.value)
    assert "seq-length 32" in message and "train_micro_batch_size_per_gpu 4" in message
    assert "gradient_accumulation_steps" in message and "checkpoint-activations" in message
    assert "attention-backend" in message
    assert (tmp_path / "run").is_dir() and not (tmp_path / "run" / "train.lock").read_text()  # lock released


def test_oom_in_evaluation_names_the_evaluation_length(tmp_path, token_dataset, monkeypatch):
    from megatron.training.trainer import Trainer

    data = train_config_dict(tmp_path, token_dataset, train_iters=1, seq_length_val=64, max_position_embeddings=64)
    trainer = Trainer(load_config([write_yaml(tmp_path / "oom.yml", data)]))
    real = trainer.model.forward

    def forward(*args, **kwargs):
        if not trainer.model.training:
            raise CPU_OOM
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer.model, "forward", forward)
    with pytest.raises(OutOfMemory, match="evaluating validation at seq-length-val 64 with "
                                          "train_micro_batch_size_per_gpu 4.*shorter seq-length-val"):
        trainer.train()
