"""The issue-12 schemes end to end: tiny pos-emb sandwich, xpos and fire models and a kerple_log model
with attention-logn-scaling train a few steps and evaluate.py sweeps them 1x..16x the train length."""
import json
import math
import os
import subprocess
import sys

import pytest

from megatron.config import load_config
from tests.conftest import ROOT, train_config_dict, write_yaml


@pytest.mark.parametrize("over", [{"pos_emb": "sandwich"}, {"pos_emb": "xpos"}, {"pos_emb": "fire"},
                                  {"pos_emb": "kerple_log", "attention_logn_scaling": True}],
                         ids=["sandwich", "xpos", "fire", "kerple_log-logn"])
def test_trains_and_sweeps_to_16x(tmp_path, token_dataset, over):
    from megatron.training.trainer import Trainer

    ck = str(tmp_path / "ck")
    data = train_config_dict(tmp_path, token_dataset, train_iters=3, save=ck, save_interval=3, **over)
    Trainer(load_config([write_yaml(tmp_path / "t.yml", data)])).train()
    out = tmp_path / "eval"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "evaluate.py"), "--checkpoint", ck, "--lengths", "32,128,512",
         "--max-tokens", "512", "--out", str(out), "--quiet"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    rec = json.loads((out / "eval.json").read_text())
    assert rec["train_length"] == 32 and rec["lengths"] == [32, 128, 512]
    assert all(math.isfinite(r["loss"]) and r["ppl"] > 1 for r in rec["results"])
