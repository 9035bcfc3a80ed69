"""Launch-configuration choice and its cache (megatron/attention/kernels/tuning.py), on CPU: the timing
function is a stand-in, so only the logic is tested (which source wins, what is stored, when
tuning runs, what survives a bad file). Real timings need a GPU (tools/bench_attention.py)."""
import json

import pytest
import torch

from megatron.attention.kernels import tuning
from megatron.attention.kernels.tuning import LaunchConfig, Tuner

GPU = "NVIDIA H100 80GB HBM3"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("KERPLE_TRITON_BLOCKS", "KERPLE_TRITON_AUTOTUNE", "KERPLE_TRITON_TUNE_CACHE"):
        monkeypatch.delenv(name, raising=False)


def timings(table):
    """A measure() that returns table[config] seconds and records what it was asked."""
    asked = []

    def measure(cfg):
        asked.append(cfg)
        value = table.get(cfg, 1.0)
        if isinstance(value, Exception):
            raise value
        return value

    return measure, asked


@pytest.mark.parametrize("length, bucket", [(1, 128), (128, 128), (129, 256), (512, 512), (600, 1024),
                                            (16384, 16384), (10**6, 65536)])
def test_length_bucket(length, bucket):
    assert tuning.length_bucket(length) == bucket


def test_cache_key_separates_what_changes_the_best_config():
    key = tuning.cache_key("fwd", GPU, torch.bfloat16, 64, 2000)
    assert key == f"{GPU}|bfloat16|d64|L2048|fwd"
    others = {tuning.cache_key(*a) for a in [("bwd", GPU, torch.bfloat16, 64, 2000), ("fwd", "A100", torch.bfloat16, 64, 2000),
                                             ("fwd", GPU, torch.float16, 64, 2000), ("fwd", GPU, torch.bfloat16, 128, 2000),
                                             ("fwd", GPU, torch.bfloat16, 64, 4096)]}
    assert key not in others and len(others) == 5
    with pytest.raises(ValueError, match="unknown kernel pass 'bwd_dq'"):
        tuning.cache_key("bwd_dq", GPU, torch.bfloat16, 64, 2000)


def test_untuned_default_without_autotune_writes_nothing(tmp_path):
    path = tmp_path / "cache.json"
    measure, asked = timings({})
    cfg = Tuner(str(path)).config("fwd", GPU, torch.bfloat16, 64, 4096, measure=measure)
    assert cfg == tuning.default_config("fwd", 64) == LaunchConfig(128, 64, 8)
    assert asked == [] and not path.exists()


def test_autotune_times_every_candidate_keeps_the_fastest_and_caches_it(tmp_path, monkeypatch):
    monkeypatch.setenv("KERPLE_TRITON_AUTOTUNE", "1")
    path = tmp_path / "sub" / "cache.json"
    winner = LaunchConfig(64, 128, 8, 3)
    too_big = LaunchConfig(128, 128, 8, 4)
    measure, asked = timings({winner: 0.5, too_big: RuntimeError("out of resources: shared memory")})
    cfg = Tuner(str(path)).config("fwd", GPU, torch.bfloat16, 64, 3000, measure=measure)
    assert cfg == winner and set(asked) == set(tuning.candidates("fwd", 64))
    stored = json.loads(path.read_text())
    assert stored == {f"{GPU}|bfloat16|d64|L4096|fwd": {"block_m": 64, "block_n": 128, "num_warps": 8, "num_stages": 3}}
    # A new process reads it back and never times again, for any length in the same bucket.
    measure, asked = timings({})
    assert Tuner(str(path)).config("fwd", GPU, torch.bfloat16, 64, 2049, measure=measure) == winner
    assert asked == []
    # Another key is tuned and added beside the first.
    Tuner(str(path)).config("bwd", GPU, torch.bfloat16, 64, 3000, measure=timings({})[0])
    assert len(json.loads(path.read_text())) == 2 and not list(path.parent.glob("*.tmp"))


def test_no_candidate_runs_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("KERPLE_TRITON_AUTOTUNE", "1")

    def measure(cfg):
        raise RuntimeError("no GPU")

    with pytest.raises(RuntimeError, match="no kernel configuration could run"):
        Tuner(str(tmp_path / "c.json")).config("bwd", GPU, torch.float32, 64, 512, measure=measure)


def test_manual_blocks_then_interpreter_win_over_the_cache(tmp_path, monkeypatch):
    path = tmp_path / "cache.json"
    key = tuning.cache_key("bwd", GPU, torch.bfloat16, 64, 512)
    tuning.save_cache(str(path), {key: LaunchConfig(32, 64, 8, 2)})
    tuner = Tuner(str(path))
    assert tuner.config("bwd", GPU, torch.bfloat16, 64, 512) == LaunchConfig(32, 64, 8, 2)
    assert tuner.config("bwd", GPU, torch.bfloat16, 64, 512, interpreter=True) == tuning.INTERPRETER["bwd"]
    monkeypatch.setenv("KERPLE_TRITON_BLOCKS", "64,32,16,128")
    assert tuner.config("bwd", GPU, torch.bfloat16, 64, 512, interpreter=True) == LaunchConfig(16, 128)
    assert tuner.config("fwd", GPU, torch.bfloat16, 64, 512) == LaunchConfig(64, 32)


def test_unreadable_cache_is_ignored_then_replaced(tmp_path, monkeypatch):
    path = tmp_path / "cache.json"
    path.write_text("{not json")
    assert tuning.load_cache(str(path)) == {}
    path.write_text(json.dumps({"a": {"block_m": 16, "block_n": 16}, "b": {"bogus": 1}, "c": [1]}))
    assert tuning.load_cache(str(path)) == {"a": LaunchConfig(16, 16)}
    monkeypatch.setenv("KERPLE_TRITON_AUTOTUNE", "1")
    Tuner(str(path)).config("fwd", GPU, torch.bfloat16, 64, 512, measure=timings({})[0])
    assert set(json.loads(path.read_text())) == {"a", f"{GPU}|bfloat16|d64|L512|fwd"}


def test_cache_path_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tuning.cache_path() == str(tmp_path / "kerple" / "triton_attention.json")
    monkeypatch.setenv("KERPLE_TRITON_TUNE_CACHE", "/x/y.json")
    assert tuning.cache_path() == "/x/y.json"


@pytest.mark.parametrize("pass_name", ["fwd", "bwd"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_candidates_include_the_default_and_launch_options(pass_name, head_dim):
    cands = tuning.candidates(pass_name, head_dim)
    assert tuning.default_config(pass_name, head_dim) in cands and len(set(cands)) == len(cands)
    assert LaunchConfig(64, 64, 8, 3).launch_options() == {"num_warps": 8, "num_stages": 3}
    assert LaunchConfig(64, 64).launch_options() == {"num_warps": 4}


def test_fp32_forward_at_head_dim_128_keeps_two_stages():
    """An H200 refused the fp32 table-path forward at head dim 128 with Triton's 3 stages (295,424 B
    of shared memory, limit 232,448); 2 stages compile to 197,120 B for sm_90 (test_triton_compile)."""
    assert tuning.default_config("fwd", 128, torch.float32) == LaunchConfig(128, 64, 8, 2)
    assert tuning.default_config("fwd", 64, torch.float32) == LaunchConfig(128, 64, 8)
    assert tuning.default_config("fwd", 128, torch.bfloat16) == LaunchConfig(128, 64, 8)
    assert tuning.default_config("fwd", 128, torch.float32) in tuning.candidates("fwd", 128, torch.float32)


class TooBig(Exception):
    """Stands in for triton's OutOfResources."""


def test_a_config_the_gpu_refuses_runs_smaller_once_said_and_remembered():
    tuner = Tuner("/nonexistent/cache.json")
    ran = []

    def run(cfg):
        ran.append(cfg)
        if cfg.num_stages is None or cfg.num_stages > 1:  # this GPU: only 1 stage fits
            raise TooBig("out of resource: shared memory, Required: 295424, Hardware limit: 232448")
        return "out"

    default = LaunchConfig(128, 64, 8)
    with pytest.warns(UserWarning, match=r"needs more GPU resources.*running LaunchConfig\(block_m=128, block_n=64, "
                                         r"num_warps=8, num_stages=1\)"):
        assert tuner.run_fitting("k", default, run, (TooBig,)) == "out"
    assert ran == [default, LaunchConfig(128, 64, 8, 2), LaunchConfig(128, 64, 8, 1)]
    ran.clear()
    assert tuner.run_fitting("k", default, run, (TooBig,)) == "out" and ran == [LaunchConfig(128, 64, 8, 1)]


def test_a_config_that_fits_is_never_changed_and_other_errors_pass_through():
    tuner = Tuner("/nonexistent/cache.json")
    cfg = LaunchConfig(32, 64)
    assert tuner.run_fitting("k", cfg, lambda c: c, (TooBig,)) is cfg and not tuner.fitted

    def broken(c):
        raise ValueError("a bug, not a resource limit")

    with pytest.raises(ValueError, match="a bug"):
        tuner.run_fitting("k", cfg, broken, (TooBig,))

    def never(c):
        raise TooBig("nothing fits")

    with pytest.raises(TooBig, match="nothing fits"):
        tuner.run_fitting("k", cfg, never, (TooBig,))


def test_smaller_configs_go_down_in_stages_then_tiles():
    got = tuning.smaller_configs(LaunchConfig(128, 64, 8))
    assert got[:4] == [LaunchConfig(128, 64, 8, 2), LaunchConfig(128, 64, 8, 1), LaunchConfig(128, 32, 8, 2),
                       LaunchConfig(128, 32, 8, 1)]
    assert got[-1] == LaunchConfig(64, 32, 8, 1)
    assert LaunchConfig(128, 64, 8) not in got
    assert tuning.smaller_configs(LaunchConfig(16, 16, 4, 1)) == []
    assert all(c.block_m >= 16 and c.block_n >= 16 for c in tuning.smaller_configs(LaunchConfig(32, 32, 4, 2)))
