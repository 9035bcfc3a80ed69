"""The Trainer on DeepSpeed's pipeline engine: PP=2 (two processes through deepy.py) trains with
the same losses as the sequential model, and its layer-file checkpoint evaluates with evaluate.py."""
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, train_config_dict
from tests.integration.fault_helpers import child_env, run_deepy, train_losses, write_config


def test_pp2_trainer_matches_sequential_and_evaluates(tmp_path, token_dataset):
    base = train_config_dict(tmp_path, token_dataset, train_iters=4, gradient_accumulation_steps=2, eval_iters=1,
                             num_layers=4)
    seq = write_config(tmp_path, "seq", {**base, "run-dir": str(tmp_path / "seq")})
    ck = str(tmp_path / "pp_ck")
    pp = write_config(tmp_path, "pp", {**base, "pipe-parallel-size": 2, "num-gpus": 2, "run-dir": str(tmp_path / "pp"),
                                       "save": ck, "save-interval": 4})
    run_deepy(seq)
    run_deepy(pp)
    a, b = train_losses(tmp_path / "seq"), train_losses(tmp_path / "pp")
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]
    for it in a:
        assert b[it] == pytest.approx(a[it], abs=1e-5), (it, a[it], b[it])
    names = sorted(os.listdir(os.path.join(ck, "global_step4")))
    assert "layer_00-model_00-model_states.pt" in names and "layer_07-model_00-model_states.pt" in names

    out = tmp_path / "eval"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "evaluate.py"), "--checkpoint", ck, "--lengths", "32,64",
                           "--max-tokens", "256", "--out", str(out), "--quiet"],
                          capture_output=True, text=True, cwd=ROOT, env=child_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "pipeline layer files" in proc.stdout
    assert json.loads((out / "eval.json").read_text())["iteration"] == 4
