"""evaluate.py's extrapolation options on tiny trained checkpoints: a rotary checkpoint evaluated
with each rotary-scaling option (set with -o, no retraining) at several lengths, and an xPos
checkpoint with blockwise causal attention."""
import json

import pytest

from megatron.config import load_config
from megatron.evaluation import sweep as evaluate
from tests.conftest import train_config_dict, write_yaml


def _train(tmp_path, token_dataset, pos):
    from megatron.training.trainer import Trainer

    ck = str(tmp_path / pos)
    data = train_config_dict(tmp_path / pos, token_dataset, train_iters=2, save=ck, save_interval=2, pos_emb=pos)
    Trainer(load_config([write_yaml(tmp_path / f"{pos}.yml", data)])).train()
    return ck


def _evaluate(ck, out, *extra):
    assert evaluate.main(["--checkpoint", ck, "--lengths", "32,512", "--max-tokens", "512", "--out", str(out),
                          "--quiet", *extra]) == 0
    return json.loads((out / "eval.json").read_text())


def test_rotary_checkpoint_with_each_scaling_option(tmp_path, token_dataset):
    ck = _train(tmp_path, token_dataset, "rotary")
    ppl = {}
    for kind in ("none", "linear", "ntk", "yarn"):
        rec = _evaluate(ck, tmp_path / kind, "-o", f"rotary-scaling={kind}", "-o", "rotary-scaling-factor=16")
        assert rec["lengths"] == [32, 512] and rec["train_length"] == 32
        assert rec["overrides"]["rotary-scaling"] == kind
        ppl[kind] = [rec["perplexity"][str(n)] for n in (32, 512)]
        assert all(1 < p < 1e6 for p in ppl[kind])
    assert len({tuple(v) for v in ppl.values()}) == 4  # each option changes the model's predictions


def test_xpos_checkpoint_with_blockwise_causal_attention(tmp_path, token_dataset):
    ck = _train(tmp_path, token_dataset, "xpos")
    full = _evaluate(ck, tmp_path / "full")
    bca = _evaluate(ck, tmp_path / "bca", "--blockwise-causal")
    assert bca["blockwise_causal"] == 16 and full["blockwise_causal"] is None
    # within two blocks (32 tokens) BCA is full causal attention; at 16x the train length it is not
    assert bca["perplexity"]["32"] == pytest.approx(full["perplexity"]["32"], rel=1e-5)
    assert bca["perplexity"]["512"] != pytest.approx(full["perplexity"]["512"], rel=1e-5)
