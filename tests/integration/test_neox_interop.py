"""NeoX / KERPLE checkpoints in: fixtures written in the exact DeepSpeed layouts (the 2022 KERPLE
pipeline layer files, the same split over TP=2, the current NeoX sequential layout), loaded
through megatron/checkpoint/reader.py, compared with our model built from the same tensors."""
import os
import random
import subprocess
import sys
from collections import OrderedDict

import numpy as np
import pytest
import torch
import yaml

from megatron.config import load_config
from megatron.model import GPTModel
from megatron.parallel.merge import merge_rule
from tests.conftest import ROOT, TINY_MODEL, write_token_dataset

L = TINY_MODEL["num-layers"]
POSITION_PREFIX = {"learned": "position_embeddings.", "sinusoidal": "position_embeddings.",
                   "alibi": "attention.alibi_embed.", "rotary": "attention.rotary_emb."}


def neox_name(key: str, pos_emb: str, legacy_mlp: bool) -> list[tuple[int, str]]:
    """(NeoX layer index, key) for each copy of our `key` (the scheme sits in every layer)."""
    if key.startswith("position."):
        prefix = POSITION_PREFIX.get(pos_emb, "attention.rpe.")
        name = prefix + key[len("position."):]
        return [(0, name)] if prefix == "position_embeddings." else [(i, name) for i in range(2, L + 2)]
    if key == "word_embeddings.weight":
        return [(0, key)]
    if key.startswith("final_norm."):
        return [(L + 3, "norm." + key[len("final_norm."):])]
    if key == "output_layer.weight":
        return [(L + 4, "final_linear.weight")]
    _, i, rest = key.split(".", 2)
    if not legacy_mlp:
        rest = rest.replace("mlp.dense_h_to_4h", "mlp.linear1").replace("mlp.dense_4h_to_h", "mlp.linear2")
    return [(int(i) + 2, rest)]


def client_state(iteration: int, tp: int, module, vocab: int) -> dict:
    """What DeepSpeed + NeoX put next to the weights in mp_rank_XX_model_states.pt."""
    return {
        "module": module, "buffer_names": [], "optimizer": None,
        "param_shapes": [OrderedDict(w=torch.Size([3, 4]))], "frozen_param_shapes": None,
        "shared_params": {}, "frozen_param_fragments": None,
        "lr_scheduler": {"start_lr": 0.0, "warmup_iter": 10, "num_iters": iteration, "decay_style": "cosine",
                         "end_iter": 100, "min_lr": 0.0},
        "data_sampler": None, "random_ltd": None, "csr_tensor_module_names": set(),
        "sparse_tensor_module_names": set(), "skipped_steps": 0, "global_steps": iteration,
        "global_samples": iteration * 8, "dp_world_size": 1, "mp_world_size": tp,
        "ds_config": {"train_batch_size": 8, "bf16": {"enabled": True}}, "ds_version": "0.3.15+eb7f5cff",
        "iteration": iteration,
        "args": {"num_layers": L, "hidden_size": 32, "num_attention_heads": 4, "max_position_embeddings": 32,
                 "make_vocab_size_divisible_by": 128, "padded_vocab_size": vocab,
                 "tokenizer_type": "CharLevelTokenizer", "model_parallel_size": tp},
        "random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
        "torch_rng_state": torch.get_rng_state(), "cuda_rng_state": torch.get_rng_state(),
        "rng_tracker_states": {"model-parallel-rng": torch.get_rng_state()},
    }


def write_neox_checkpoint(out, model, cfg_dict, layout="pipeline", tp=1, iteration=10, dtype=torch.bfloat16):
    """Our model's weights written as NeoX/DeepSpeed would: returns the checkpoint directory."""
    pos_emb = cfg_dict["pos-emb"]
    tag_dir = os.path.join(out, f"global_step{iteration}")
    os.makedirs(os.path.join(tag_dir, "configs"))
    per_rank = [dict() for _ in range(tp)]  # rank -> {(idx, key): tensor}
    for key, t in model.state_dict().items():
        dim = merge_rule(key, pos_emb)
        parts = [t] * tp if dim is None else list(t.chunk(tp, dim=dim))
        for idx, name in neox_name(key, pos_emb, legacy_mlp=layout == "pipeline"):
            for r in range(tp):
                per_rank[r][(idx, name)] = parts[r].to(dtype).clone()
    vocab = model.word_embeddings.weight.shape[0]
    for r, tensors in enumerate(per_rank):
        if layout == "pipeline":
            for idx in sorted({i for i, _ in tensors}):
                layer = {k: v for (i, k), v in tensors.items() if i == idx}
                torch.save(layer, os.path.join(tag_dir, f"layer_{idx:02d}-model_{r:02d}-model_states.pt"))
            module = None
        else:
            module = OrderedDict((f"sequential.{i}.{k}", v) for (i, k), v in sorted(tensors.items()))
        torch.save(client_state(iteration, tp, module, vocab), os.path.join(tag_dir, f"mp_rank_{r:02d}_model_states.pt"))
    cfg = {**cfg_dict, "model-parallel-size": tp, "pipe-parallel-size": 1 if layout == "pipeline" else 0}
    with open(os.path.join(tag_dir, "configs", "kerple.yml"), "w") as f:
        yaml.safe_dump(cfg, f)
    with open(os.path.join(out, "latest"), "w") as f:
        f.write(f"global_step{iteration}")
    return str(out)


def reference_model(tmp_path, cfg_dict, seed=0):
    torch.manual_seed(seed)
    path = tmp_path / "ref.yml"
    path.write_text(yaml.safe_dump(cfg_dict))
    model = GPTModel(load_config([str(path)]).model, 128)
    with torch.no_grad():  # give every tensor non-trivial values (norms, biases start at 1 / 0)
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def rounded_copy(model, dtype=torch.bfloat16):
    """Our model holding the bf16-rounded tensors the fixture stores (the 'same tensors')."""
    out = GPTModel(model.model_cfg, model.vocab_size).eval()
    out.load_state_dict({k: v.to(dtype).float() if k not in ("position.inv_freq", "position.slopes") else v
                         for k, v in model.state_dict().items()})
    return out


def tiny_neox_config(pos_emb="kerple_log", **over):
    return {**TINY_MODEL, "pos-emb": pos_emb, "tokenizer-type": "CharLevelTokenizer", **over}


CASES = [("pipeline", 1, "kerple_log"), ("pipeline", 2, "kerple_log"), ("sequential", 1, "kerple_log"),
         ("sequential", 2, "kerple_power_ap_ap"), ("pipeline", 2, "rpe"), ("pipeline", 1, "alibi"),
         ("sequential", 1, "rotary"), ("pipeline", 1, "learned")]


@pytest.mark.parametrize("layout,tp,pos_emb", CASES)
def test_neox_layouts_load_with_same_logits(tmp_path, capsys, layout, tp, pos_emb):
    from megatron.checkpoint.load_model import load_checkpoint_model

    cfg = tiny_neox_config(pos_emb)
    model = reference_model(tmp_path, cfg)
    ck = write_neox_checkpoint(tmp_path / "ck", model, cfg, layout, tp)
    loaded, lcfg, client = load_checkpoint_model(ck)
    out = capsys.readouterr().out
    assert ("2022 KERPLE" if layout == "pipeline" else "sequential") in out
    assert out.count("has no manifest.json (saved before checkpoints carried one, or by NeoX)") == 1  # per load
    assert client["iteration"] == 10 and lcfg.model.pos_emb == pos_emb
    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    tokens = torch.randint(0, 128, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens), rounded_copy(model)(tokens), rtol=0, atol=0)


@pytest.fixture
def kerple_ckpt(tmp_path):
    cfg = tiny_neox_config("kerple_log")
    model = reference_model(tmp_path, cfg)
    return write_neox_checkpoint(tmp_path / "ck", model, cfg, "pipeline", tp=2), model


def _error(ck, **kw):
    from megatron.checkpoint.errors import CheckpointError
    from megatron.checkpoint.reader import read_tp1_state

    with pytest.raises(CheckpointError) as e:
        read_tp1_state(ck, **kw)
    return str(e.value)


def test_missing_latest(kerple_ckpt):
    ck, _ = kerple_ckpt
    os.remove(os.path.join(ck, "latest"))
    assert "has no `latest` file" in _error(ck) and "--iteration" in _error(ck)
    from megatron.checkpoint.reader import read_tp1_state

    assert read_tp1_state(ck, tag="global_step10").vocab_size == 128


def test_truncated_shard(kerple_ckpt):
    ck, _ = kerple_ckpt
    path = os.path.join(ck, "global_step10", "layer_03-model_01-model_states.pt")
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])
    msg = _error(ck)
    assert "layer_03-model_01-model_states.pt" in msg and "truncated or corrupt" in msg


def test_wrong_shape_tensor(kerple_ckpt):
    ck, _ = kerple_ckpt
    path = os.path.join(ck, "global_step10", "layer_02-model_01-model_states.pt")
    layer = torch.load(path, weights_only=True)
    layer["mlp.dense_h_to_4h.weight"] = layer["mlp.dense_h_to_4h.weight"][:40]
    torch.save(layer, path)
    msg = _error(ck)
    assert "layer_02-model_01-model_states.pt" in msg and "mlp.dense_h_to_4h.weight" in msg
    assert "expected shape (64, 32) (1/2 of (128, 32)), found (40, 32)" in msg


def test_missing_layer_file_and_disagreeing_scheme_copies(kerple_ckpt):
    ck, _ = kerple_ckpt
    step = os.path.join(ck, "global_step10")
    path = os.path.join(step, "layer_03-model_00-model_states.pt")
    layer = torch.load(path, weights_only=True)
    layer["attention.rpe.bias_p"] = layer["attention.rpe.bias_p"] + 1
    torch.save(layer, path)
    assert "bias_p differs from the copy in layer_02-model_00" in _error(ck)
    os.remove(path)
    assert "layers.1." in _error(ck) and "missing" in _error(ck)


def test_unsafe_pickle_needs_trust(kerple_ckpt, monkeypatch):
    from megatron.checkpoint.errors import UnsafeCheckpointError
    from megatron.checkpoint.reader import read_tp1_state

    ck, _ = kerple_ckpt
    path = os.path.join(ck, "global_step10", "mp_rank_00_model_states.pt")
    blob = torch.load(path, weights_only=False)
    blob["extra"] = yaml.SafeLoader  # any class outside the allow-list
    torch.save(blob, path)
    with pytest.raises(UnsafeCheckpointError, match="mp_rank_00_model_states.pt .*yaml.loader.SafeLoader.*--trust-checkpoint"):
        read_tp1_state(ck)
    assert read_tp1_state(ck, trust=True).client["iteration"] == 10
    monkeypatch.setenv("KERPLE_TRUST_CHECKPOINT", "1")
    assert read_tp1_state(ck).client["iteration"] == 10


def test_convert_then_evaluate_cli(tmp_path, kerple_ckpt):
    import json

    ck, model = kerple_ckpt
    data = write_token_dataset(str(tmp_path / "tiny_text_document"))
    out = tmp_path / "converted"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "convert_neox_checkpoint.py"),
                           "--input", ck, "--output", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "2022 KERPLE" in proc.stdout and "2 tensor-parallel shards merged" in proc.stdout
    from megatron.checkpoint.load_model import load_checkpoint_model

    converted, _, _ = load_checkpoint_model(str(out))
    tokens = torch.randint(0, 128, (1, 20))
    with torch.no_grad():
        torch.testing.assert_close(converted(tokens), rounded_copy(model)(tokens), rtol=0, atol=0)
    # evaluate.py straight on the foreign checkpoint (its config has no data path: -o gives it)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "evaluate.py"), "--checkpoint", ck, "--lengths", "32,64",
                           "--max-tokens", "256", "--out", str(tmp_path / "eval"), "--quiet", "-o", f"data-path={data}",
                           "-o", "split=80,10,10"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("2022 KERPLE") == 1
    rec = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert rec["iteration"] == 10 and set(rec["perplexity"]) == {"32", "64"}


def test_trainer_load_foreign_weights_only(tmp_path, capsys):
    from megatron.training.trainer import Trainer
    from tests.conftest import train_config_dict, write_yaml

    cfg = tiny_neox_config("kerple_log")
    model = reference_model(tmp_path, cfg)
    ck = write_neox_checkpoint(tmp_path / "ck", model, cfg, "sequential", tp=1, dtype=torch.float32)
    data = write_token_dataset(str(tmp_path / "tiny_text_document"))
    conf = train_config_dict(tmp_path, data, train_iters=1, load=ck)
    trainer = Trainer(load_config([write_yaml(tmp_path / "t.yml", conf)]))
    assert "module weights only" in capsys.readouterr().out and trainer.iteration == 0
    got = trainer.engine.module.state_dict()
    for k, v in model.state_dict().items():
        torch.testing.assert_close(got[k], v)
