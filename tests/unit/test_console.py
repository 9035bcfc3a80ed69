"""What a run prints (megatron/console.py): rank prefixes on several processes' lines, DeepSpeed's
lines that say nothing to a user dropped, its warnings kept."""
from __future__ import annotations

import io
import logging
import sys

import pytest
import torch

from megatron import console
from megatron.process import op_cache


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def deepspeed_log():
    console.quiet_third_party()
    logger, handler = logging.getLogger(console.DEEPSPEED_LOGGER), _Records()
    logger.addHandler(handler)
    yield handler.messages
    logger.removeHandler(handler)


@pytest.mark.skipif(torch.cuda.is_available(), reason="DeepSpeed warns only where it finds no accelerator")
def test_deepspeeds_cpu_warning_is_dropped_and_its_other_warnings_kept(deepspeed_log, monkeypatch):
    from deepspeed.accelerator import real_accelerator

    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    monkeypatch.setattr(real_accelerator, "ds_accelerator", None)  # detect again, as at its import
    assert real_accelerator.get_accelerator().device_name() == "cpu"
    logging.getLogger(console.DEEPSPEED_LOGGER).warning("a real warning")
    assert deepspeed_log == ["a real warning"]


def test_the_missing_hostfile_line_is_dropped_only_when_asked(deepspeed_log):
    from megatron.launch.hosts import MISSING_HOSTFILE

    logger = logging.getLogger(console.DEEPSPEED_LOGGER)
    logger.warning(MISSING_HOSTFILE)
    console.drop_log_message(MISSING_HOSTFILE)
    logger.warning(MISSING_HOSTFILE)
    assert deepspeed_log == [MISSING_HOSTFILE]
    console._DROPPED_LOG_MESSAGES.pop()  # this process's later tests see DeepSpeed's runner as it is


def test_rank_other_than_0_prefixes_its_lines(monkeypatch):
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    console.prefix_rank_output()
    console.prefix_rank_output()  # twice: still one prefix
    print("no checkpoint", flush=True)
    print("two\nlines", file=sys.stderr, flush=True)
    console.say("said by rank 0 only")
    assert out.getvalue() == "[rank 1] no checkpoint\n"
    assert err.getvalue() == "[rank 1] two\n[rank 1] lines\n"


@pytest.mark.parametrize("world,rank,prefixed", [("2", "0", False), ("1", "0", False), ("4", "3", True)])
def test_rank_0_and_single_processes_are_left_as_they_are(monkeypatch, world, rank, prefixed):
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    monkeypatch.setenv("WORLD_SIZE", world)
    monkeypatch.setenv("RANK", rank)
    console.prefix_rank_output()
    console.say("run line")
    print("x", flush=True)
    assert out.getvalue() == ("[rank 3] x\n" if prefixed else "run line\nx\n")


def test_op_load_line_dropped_and_a_real_build_said_once(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))  # nothing cached: a slow load is a first build
    with op_cache.quiet_op_load("starting the process group"):
        print("DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully")
        print("something else")
    assert capsys.readouterr().out == "something else\n"
    monkeypatch.setattr(op_cache, "COMPILED_OP_SECONDS", -1.0)  # as if it had compiled
    with op_cache.quiet_op_load("starting the process group"):
        print("DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully")
    out = capsys.readouterr().out
    assert out.startswith("[deepspeed] starting the process group took") and "cached in" in out
    with op_cache.quiet_op_load("starting the process group", is_rank0=False):
        pass
    assert capsys.readouterr().out == ""


def test_the_runner_is_asked_for_warnings_only(tiny_config, monkeypatch):
    from megatron.launch.launcher import runner_args

    args = runner_args(tiny_config(num_gpus=2), "train.py", "r.yml")
    assert args[args.index("--log_level") + 1] == "warning"
    monkeypatch.setenv("KERPLE_DEBUG", "1")
    args = runner_args(tiny_config(num_gpus=2), "train.py", "r.yml")
    assert args[args.index("--log_level") + 1] == "info"


def test_debug_keeps_every_line(deepspeed_log, monkeypatch, capsys):
    monkeypatch.setattr(console, "_keep_all", False)  # restored after the test
    console.quiet_third_party(keep_all=True)  # what run_cli does under --debug
    logging.getLogger(console.DEEPSPEED_LOGGER).warning("Setting accelerator to CPU. If you have GPU or other")
    with op_cache.quiet_op_load("starting the process group"):
        print("DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully")
    assert len(deepspeed_log) == 1 and "built successfully" in capsys.readouterr().out


def test_torchs_deprecation_of_what_deepspeed_calls_is_dropped(monkeypatch):
    import warnings

    monkeypatch.setattr(console, "_keep_all", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        console.quiet_third_party()
        warnings.warn("`torch.distributed.all_gather_into_tensor` is deprecated. Please use ...", FutureWarning, stacklevel=1)
        warnings.warn("something else is deprecated", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["something else is deprecated"]


def _fake_op_cache(tmp_path, monkeypatch, up_to_date: bool):
    """A TORCH_EXTENSIONS_DIR holding one 'op' that ninja builds by copying a file."""
    import os
    import subprocess
    import sys

    monkeypatch.setenv("PATH", os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    op = tmp_path / "ext" / "fake_op"
    op.mkdir(parents=True)
    (op / "src.txt").write_text("source")
    (op / "build.ninja").write_text("rule cp\n  command = cp $in $out\nbuild fake_op.so: cp src.txt\n")
    subprocess.run(["ninja", "-C", str(op)], check=True, capture_output=True)
    if not up_to_date:  # the cache's own record no longer matches: as after a copy
        os.utime(op / "src.txt", (4e9, 4e9))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))


def test_a_rebuild_of_a_cached_op_says_why(tmp_path, monkeypatch, capsys):
    """Issue 45: every switch between `make` and an activated venv rebuilt the op (87-211 s) and the
    line called it "a first build". A rebuild of a cached op now names ninja's reason; an up-to-date
    cache that was merely slow to load claims no build."""
    monkeypatch.setattr(op_cache, "COMPILED_OP_SECONDS", -1.0)  # as if the load had been slow
    _fake_op_cache(tmp_path / "a", monkeypatch, up_to_date=False)
    with op_cache.quiet_op_load("starting the process group"):
        pass
    out = capsys.readouterr().out
    assert "built again, because ninja says: output fake_op.so older than most recent input" in out, out
    assert "first build" not in out
    _fake_op_cache(tmp_path / "b", monkeypatch, up_to_date=True)
    with op_cache.quiet_op_load("starting the process group"):
        pass
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "empty"))
    with op_cache.quiet_op_load("starting the process group"):
        pass
    assert "a first build" in capsys.readouterr().out
