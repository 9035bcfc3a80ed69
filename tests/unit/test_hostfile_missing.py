"""A hostfile that does not exist behaves as in DeepSpeed's runner: a warning, then training on
this machine (NeoX's own configs set `hostfile: /mock_path`). It used to be a config error."""
from __future__ import annotations

from unittest import mock

import pytest

from megatron import errors
from megatron.config.errors import INPUT
from megatron.config.inputs import input_problems
from megatron.launch import launcher
from megatron.launch.hosts import MISSING_HOSTFILE, hostfile_in_use
from megatron.launch.launcher import runner_args


def test_the_warning_is_deepspeeds_own(tmp_path):
    from deepspeed.launcher import runner

    with mock.patch.object(runner.logger, "warning") as warn:
        assert runner.fetch_hostfile(str(tmp_path / "mock_path")) is None  # None: local resources
    warn.assert_called_once_with(MISSING_HOSTFILE)


def test_missing_hostfile_is_not_a_problem_unless_more_nodes_are_asked_for(tiny_config):
    cfg = tiny_config(hostfile="/mock_path")
    assert hostfile_in_use(cfg.parallel.hostfile) is None
    assert input_problems(cfg) == []
    # the runner passes it on; DeepSpeed then trains locally, as deepy.py announced
    assert runner_args(cfg, "train.py", "r.yml")[:2] == ["--hostfile", "/mock_path"]
    [problem] = input_problems(tiny_config(hostfile="/mock_path", num_nodes=2))
    assert problem.kind == INPUT and "hostfile = '/mock_path'" in str(problem) and "num-nodes 2" in str(problem)


def test_deepy_warns_and_trains_here(tmp_path, monkeypatch, capsys, token_dataset):
    from tests.conftest import train_config_dict, write_yaml

    conf = write_yaml(tmp_path / "c.yml", train_config_dict(tmp_path, token_dataset, hostfile="/mock_path"))
    monkeypatch.setattr("deepspeed.launcher.runner.main", lambda argv: pytest.fail("the runner was started"))
    ran = []
    monkeypatch.setattr("megatron.launch.launcher.runpy.run_path", lambda script, run_name: ran.append(script))
    monkeypatch.setattr("sys.argv", ["deepy.py", "train.py", conf])
    with pytest.raises(SystemExit) as e:
        errors.run_cli(launcher.main, "deepy.py")
    out = capsys.readouterr().out
    assert e.value.code == 0 and ran == ["train.py"]  # one process, on this machine (a CPU here)
    assert f"hostfile '/mock_path' does not exist. {MISSING_HOSTFILE}" in out
