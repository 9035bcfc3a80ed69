"""Device and process group chosen together: `auto` is the GPU where torch sees
one (unless DS_ACCELERATOR=cpu), a CPU run gets gloo even on a GPU machine, and every entry point
defaults to `auto`. A GPU machine is simulated here (torch.cuda.is_available -> True), since the
bug was precisely a choice made from is_available() instead of from the device."""
import importlib
import subprocess
import sys

import pytest
import torch

from megatron.config import ConfigError
from megatron.device import DeviceError, process_group_backend, resolve_device
from tests.conftest import ROOT, checkpoint_layout


@pytest.fixture
def fake_gpus(monkeypatch):
    """A machine where torch sees `n` GPUs (nothing is ever run on them)."""
    def make(n=1):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return make


def test_auto_is_the_gpu_where_there_is_one(fake_gpus, monkeypatch):
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    fake_gpus(2)
    assert resolve_device("auto") == torch.device("cuda", 0)
    assert resolve_device(None) == torch.device("cuda", 0)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device("cpu") == torch.device("cpu")


def test_ds_accelerator_cpu_makes_auto_the_cpu(fake_gpus, monkeypatch):
    fake_gpus(1)
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(DeviceError, match="contradicts DS_ACCELERATOR=cpu"):
        resolve_device("cuda")


@pytest.mark.parametrize("name,words", [
    ("tpu", "is not a device"), ("gpu", "is not a device"), ("mps", "only cpu and cuda"),
])
def test_bad_device_names(name, words):
    with pytest.raises(DeviceError, match=words):
        resolve_device(name)


def test_cuda_without_a_gpu_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    with pytest.raises(DeviceError, match="torch sees no GPU; use --device cpu"):
        resolve_device("cuda")
    with pytest.raises(DeviceError, match="device: 'cuda' but torch sees no GPU"):
        resolve_device("cuda", what="device:")


def test_gpu_ordinal_out_of_range(fake_gpus, monkeypatch):
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    fake_gpus(1)
    with pytest.raises(DeviceError, match="sees 1 GPU"):
        resolve_device("cuda:1")


def test_backend_follows_the_device_not_the_machine(fake_gpus):
    fake_gpus(1)
    assert process_group_backend(torch.device("cpu")) == "gloo"
    assert process_group_backend(torch.device("cpu"), "nccl") == "gloo"
    assert process_group_backend(torch.device("cuda", 0)) == "nccl"
    assert process_group_backend(torch.device("cuda", 0), "gloo") == "gloo"


def test_cpu_training_on_a_gpu_machine_initialises_gloo(fake_gpus, monkeypatch):
    """The H100 failure: DS_ACCELERATOR=cpu but `nccl` because CUDA was available."""
    import deepspeed

    from megatron.process import distributed

    fake_gpus(1)
    calls = []
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: bool(calls))
    monkeypatch.setattr(deepspeed, "init_distributed", lambda dist_backend, **kw: calls.append(dist_backend))
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 0)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 1)
    monkeypatch.setattr(distributed.atexit, "register", lambda fn: None)
    info = distributed.init_distributed("cpu", "nccl")
    assert calls == ["gloo"] and info.device == torch.device("cpu")
    from deepspeed.accelerator import get_accelerator

    assert get_accelerator().device_name() == "cpu"  # deepspeed.initialize then keeps tensors on the CPU


def test_deepspeed_accelerator_is_switched_to_the_device():
    """A process that trained on one device and now trains on the other (a test session)."""
    from deepspeed.accelerator import real_accelerator
    from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator

    from megatron.device import select_deepspeed_accelerator

    before = real_accelerator.ds_accelerator
    try:
        real_accelerator.set_accelerator(CUDA_Accelerator())
        select_deepspeed_accelerator(torch.device("cpu"))
        assert real_accelerator.get_accelerator().device_name() == "cpu"
    finally:
        real_accelerator.ds_accelerator = before


def test_launcher_starts_one_process_for_a_cpu_run(fake_gpus, monkeypatch, tiny_config):
    from megatron.launch.launcher import processes_per_node

    fake_gpus(4)
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    assert processes_per_node(tiny_config()) == 4  # NeoX: every visible GPU
    assert processes_per_node(tiny_config(device="cpu")) == 1
    assert processes_per_node(tiny_config(device="cpu", num_gpus=2)) == 2
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    assert processes_per_node(tiny_config()) == 1


def test_fp16_is_refused_for_a_cpu_run_on_a_gpu_machine(fake_gpus, tiny_config):
    from megatron.training.trainer import check_precision_supported

    fake_gpus(1)
    cfg = tiny_config(fp16={"enabled": True})
    with pytest.raises(ValueError, match="fp16 training needs a GPU"):
        check_precision_supported(cfg, torch.device("cpu"))
    check_precision_supported(cfg, torch.device("cuda", 0))


def test_device_config_key(tiny_config):
    assert tiny_config().parallel.device == "auto"
    assert tiny_config(device="cpu").parallel.device == "cpu"
    with pytest.raises(ConfigError, match="device"):
        tiny_config(device="gpu")
    with pytest.raises(ConfigError, match="distributed-backend"):
        tiny_config(distributed_backend="mpi")


@pytest.mark.parametrize("module", ["megatron.evaluation.sweep", "megatron.generate_command"])
def test_entry_points_default_to_auto(module):
    parse = importlib.import_module(module).parse_args  # evaluate.py's and generate.py's flags
    args = parse(["--checkpoint", "x", "--prompt", "a"] if "generate" in module else ["--checkpoint", "x"])
    assert args.device == "auto"


@pytest.mark.parametrize("argv", [
    ["evaluate.py", "--checkpoint", "CKPT", "--device", "cuda"],
    ["generate.py", "--checkpoint", "CKPT", "--prompt", "a", "--device", "cuda"],
    ["tools/export_hf.py", "--checkpoint", "CKPT", "--out", "OUT", "--device", "cuda"],
    ["evaluate.py", "--checkpoint", "CKPT", "--device", "tpu"],
])
def test_entry_point_device_errors_are_one_message(argv, tmp_path):
    if torch.cuda.is_available() and argv[-1] == "cuda":
        pytest.skip("this machine has a GPU")
    checkpoint_layout(tmp_path / "ckpt")  # a missing checkpoint would be reported first, before torch loads
    argv = [a.replace("CKPT", str(tmp_path / "ckpt")).replace("OUT", str(tmp_path / "hf")) for a in argv]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ROOT, "HOME": str(tmp_path)}  # no DS_ACCELERATOR
    proc = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "--device" in proc.stderr, proc.stderr[-2000:]
