"""DP=2 (two processes through deepy.py's DeepSpeed launch, gloo) equals DP=1 at the same global
batch: the same samples per step, gradients averaged instead of accumulated."""

import pytest

from megatron.launch.shm_buffers import launch_buffers
from megatron.process.distributed import free_port
from megatron.process.metrics_file import read_metrics
from tests.conftest import train_config_dict
from tests.integration.fault_helpers import run_deepy, train_losses, write_config


@pytest.mark.parametrize("zero_stage", [0, 2, 3])
def test_dp2_equals_dp1(tmp_path, token_dataset, zero_stage):
    base = train_config_dict(tmp_path, token_dataset, train_iters=5, train_micro_batch_size_per_gpu=4,
                             zero_optimization={"stage": zero_stage}, eval_iters=1)
    one = write_config(tmp_path, "dp1", {**base, "gradient-accumulation-steps": 2, "run-dir": str(tmp_path / "dp1")})
    two = write_config(tmp_path, "dp2", {**base, "gradient-accumulation-steps": 1, "num-gpus": 2,
                                         "run-dir": str(tmp_path / "dp2")})
    port = free_port()
    out = run_deepy(two, port=port)  # first, on a fresh index-map cache
    # DeepSpeed's CPU all-reduce buffers (66 MB of /dev/shm a rank) are gone with the run
    assert launch_buffers(port) == []
    run_deepy(one)
    assert "world_size=2" in out or "dp 2" in out, out[-2000:]
    # one voice for the run (issue 34): rank 1's lines prefixed, DeepSpeed's noise and the runner's
    # INFO lines gone, each split's index maps built once on this fresh cache
    assert "[rank 1] [checkpoint]" not in out and "[rank 1] device" not in out, out[-3000:]
    for noise in ("built successfully", "Setting accelerator", "exits successfully", "WORLD INFO", "damaged"):
        assert noise not in out, (noise, out[-3000:])
    assert out.count("built train index maps") == 1, out[-3000:]
    a, b = train_losses(tmp_path / "dp1"), train_losses(tmp_path / "dp2")
    assert sorted(a) == sorted(b) == [1, 2, 3, 4, 5]
    for it in a:
        assert b[it] == pytest.approx(a[it], abs=1e-5), (it, a[it], b[it])
    rows = {name: read_metrics(tmp_path / name / "metrics.jsonl") for name in ("dp1", "dp2")}
    assert [r["processes"] for r in rows["dp2"] if r["kind"] == "start"] == [2]  # where it trained, in its log
    stats, one_stats = ([r for r in rows[name] if r["kind"] == "train"][0] for name in ("dp2", "dp1"))
    assert stats["bias_p_mean"] == pytest.approx(one_stats["bias_p_mean"], abs=1e-6)
