"""What training logs: tokens/s, the gradient norm and an ETA always; per-parameter gradient and
parameter norms when asked (log-grad-norm, log-param-norm); TensorBoard under run-dir; MFU on CUDA."""
import glob
import json
import math
import re

import pytest
import torch

from megatron.config import load_config
from tests.conftest import train_config_dict, write_yaml


def train(tmp_path, prefix, **over):
    from megatron.training.trainer import Trainer

    cfg = load_config([write_yaml(tmp_path / "logs.yml", train_config_dict(tmp_path, prefix, **over))])
    Trainer(cfg).train()
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        return [row for row in map(json.loads, f) if row["kind"] == "train"]


def test_norms_throughput_eta_and_tensorboard(tmp_path, token_dataset, capsys):
    # 7 steps: the ETA is said once 4 steps after the first 2 are timed (megatron/process/logging.py)
    rows = train(tmp_path, token_dataset, train_iters=7, log_grad_norm=True, log_param_norm=True)
    out = capsys.readouterr().out
    assert re.search(r"^iteration 6/7 .*\| eta: ~00:00:0\d \|$", out, flags=re.M) and "tokens_per_sec" in out
    assert "| eta:" not in out.split("iteration 6/7")[0]  # steps 1-5: too few timed
    assert re.search(r"^model: .* \| ready after \d+\.\ds$", out, flags=re.M), out  # the setup phase, timed
    for row in rows:
        assert row["tokens_per_sec"] == pytest.approx(row["samples_per_sec"] * 32)  # seq-length 32
        assert row["grad_norm"] > 0 and math.isfinite(row["grad_norm"])
        grads = {k: v for k, v in row.items() if k.startswith("grad_norm/")}
        params = {k: v for k, v in row.items() if k.startswith("param_norm/")}
        assert grads and params and len(grads) == len(params)
        # the global norm (from p.grad) and the per-parameter norms (DeepSpeed's safe_get_full_grad)
        assert row["grad_norm"] == pytest.approx(math.sqrt(sum(v * v for v in grads.values())), rel=1e-5)
        assert row["param_norm"] == pytest.approx(math.sqrt(sum(v * v for v in params.values())), rel=1e-6)
        assert "mfu" not in row  # a CPU run (train_config_dict says device: cpu), on a GPU machine too
    assert "grad_norm/" not in out  # per-parameter figures stay out of the console line
    # tensorboard-dir not set: <run-dir>/tensorboard (megatron/config/paths.py)
    assert glob.glob(str(tmp_path / "run" / "tensorboard" / "events.out.tfevents.*"))


def test_param_norm_only_when_asked(tmp_path, token_dataset):
    rows = train(tmp_path, token_dataset, train_iters=1)
    assert "grad_norm" in rows[0] and "param_norm" not in rows[0]
    assert not [k for k in rows[0] if "/" in k]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="MFU is logged on CUDA only")
def test_mfu_on_cuda(tmp_path, token_dataset, capsys, monkeypatch):
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)  # the suite's CPU pin (tests/conftest.py)
    rows = train(tmp_path, token_dataset, train_iters=3, precision="bfloat16", device="cuda")
    out = capsys.readouterr().out
    assert "device cuda:0" in out and "process group nccl" in out and "[throughput] MFU against" in out
    assert all(0 < row["mfu"] < 1 for row in rows)


def test_the_final_validation_is_printed_once(tmp_path, token_dataset, capsys):
    """train-iters a multiple of eval-interval: the last interval's validation is the end-of-training
    one (NeoX evaluated the same batches twice and printed both); metrics.jsonl holds it once too."""
    train(tmp_path, token_dataset, train_iters=4, eval_interval=2, eval_iters=1)
    out = capsys.readouterr().out
    assert out.count("validation results at") == 2, out  # iterations 2 and 4, the latter also the final one
    assert "validation results at iteration 4" in out and "the end of training for test data" in out
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        rows = [row for row in map(json.loads, f) if row["kind"] == "validation"]
    assert [row["iteration"] for row in rows] == [2, 4]
