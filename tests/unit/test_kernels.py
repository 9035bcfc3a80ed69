"""Kernel extraction from a saved tiny checkpoint equals each scheme's closed form."""
import math
import os

import numpy as np
import pytest

from megatron.config import load_config
from megatron.evaluation.kernels import learned_kernels
from megatron.positional.alibi import alibi_slopes
from tests.conftest import train_config_dict, write_yaml


def train_tiny(tmp_path, token_dataset, pos_emb: str) -> str:
    from megatron.training.trainer import Trainer

    ck = str(tmp_path / f"ck_{pos_emb}")
    data = train_config_dict(tmp_path, token_dataset, train_iters=2, save=ck, save_interval=2, pos_emb=pos_emb,
                             run_dir=str(tmp_path / f"run_{pos_emb}"))
    Trainer(load_config([write_yaml(tmp_path / f"{pos_emb}.yml", data)])).train()
    return ck


def test_kerple_log_kernel_is_closed_form(tmp_path, token_dataset):
    import torch

    ck = train_tiny(tmp_path, token_dataset, "kerple_log")
    out = learned_kernels(ck, 100)
    assert out["scheme"] == "kerple_log" and out["iteration"] == 2 and out["kernel"].shape == (4, 101)
    state = torch.load(f"{ck}/global_step2/mp_rank_00_model_states.pt", weights_only=False)["module"]
    p = next(v for k, v in state.items() if k.endswith("bias_p")).flatten().double().clamp_min(1e-2).numpy()
    a = next(v for k, v in state.items() if k.endswith("bias_a")).flatten().double().clamp_min(1e-2).numpy()
    d = np.arange(101)
    expected = -p[:, None] * np.log1p(a[:, None] * d[None, :])
    np.testing.assert_allclose(out["kernel"], expected, rtol=1e-5, atol=1e-6)
    assert np.all(out["kernel"][:, 0] == 0)


def test_alibi_kernel_is_closed_form(tmp_path, token_dataset):
    ck = train_tiny(tmp_path, token_dataset, "alibi")
    out = learned_kernels(ck, 64)
    slopes = np.array(alibi_slopes(4))
    assert slopes[0] == pytest.approx(2 ** -2) and slopes[-1] == pytest.approx(2 ** -8)
    np.testing.assert_allclose(out["kernel"], -slopes[:, None] * np.arange(65)[None, :], rtol=1e-6)
    assert math.isclose(out["kernel"][0, 64], -16.0, rel_tol=1e-6)


def test_scheme_without_bias_gives_none(tmp_path, token_dataset):
    ck = train_tiny(tmp_path, token_dataset, "rotary")
    assert learned_kernels(ck, 16) is None


def test_make_report_writes_kernel_plot(tmp_path, token_dataset):
    import json

    from study import make_report

    ck = train_tiny(tmp_path, token_dataset, "kerple_log")
    train_tiny(tmp_path, token_dataset, "rotary")
    res = tmp_path / "res" / "eval.json"
    res.parent.mkdir()
    res.write_text(json.dumps({"schema": "kerple-eval/1", "pos_emb": "kerple_log", "window": None, "data_path": "d",
                               "results": [{"length": 64, "ppl": 3.0}], "positionwise": {}}))
    out = tmp_path / "report"
    rc = make_report.main(["--results", str(res), "--checkpoints", str(tmp_path / "ck_*"), "--out", str(out)])
    assert rc == 0 and (out / "table3.md").exists()
    png = (out / "kernels.png").read_bytes()
    assert png[:4] == b"\x89PNG" and len(png) < 150_000
    assert os.path.isdir(ck)


def test_fire_kernel_at_several_query_positions(tmp_path, token_dataset):
    """FIRE's bias depends on the query position: read at i = 8, 16, 32 (keys 0..i) from a trained
    checkpoint, each equal to the paper's formula on the saved parameters, and plotted."""

    import torch

    from megatron.training.trainer import Trainer

    ck = str(tmp_path / "ck_fire")
    data = train_config_dict(tmp_path, token_dataset, train_iters=2, save=ck, save_interval=2, pos_emb="fire",
                             fire_init_threshold=4.0, run_dir=str(tmp_path / "run_fire"))
    Trainer(load_config([write_yaml(tmp_path / "fire.yml", data)])).train()
    out = learned_kernels(ck, 32)
    assert sorted(out["by_query"]) == [8, 16, 32]
    np.testing.assert_array_equal(out["by_query"][32], out["kernel"])
    state = torch.load(f"{ck}/global_step2/mp_rank_00_model_states.pt", weights_only=False)["module"]
    p = {k.split(".")[-1]: v.double().numpy() for k, v in state.items() if k.startswith("position.")}
    c, L = abs(p["c"].item()), abs(p["threshold_multiplier"].item()) * 4.0
    for i, f in out["by_query"].items():
        d = np.arange(i + 1)
        x = np.log(c * d + 1) / (np.log(c * max(L, i) + 1) + 1e-6)
        hidden = np.maximum(x[:, None] * p["hidden_weight"][:, 0] + p["hidden_bias"], 0)  # [d, W]
        np.testing.assert_allclose(f, p["out_weight"] @ hidden.T + p["out_bias"][:, None], rtol=1e-5, atol=1e-6)
    assert not np.allclose(out["by_query"][8], out["by_query"][16][:, :9])  # the query matters

    from study import make_report

    logs = []
    (tmp_path / "report").mkdir()
    path = make_report.kernel_plot([ck], 32, str(tmp_path / "report"), log=logs.append)
    assert open(path, "rb").read(4) == b"\x89PNG" and logs == [f"wrote {path}"]
