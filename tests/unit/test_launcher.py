"""deepy.py's launch decision and the DeepSpeed runner command line it builds."""
import os

import pytest

from megatron.config import ConfigError
from megatron.launch.launcher import processes_per_node, runner_args
from tests.conftest import ROOT


def test_runner_args_for_a_hostfile_cluster(tiny_config):
    cfg = tiny_config(hostfile=os.path.join(ROOT, "configs/cluster/hostfile.example"), num_nodes=2, num_gpus=8,
                      master_addr="node001", master_port=29600, launcher="slurm")
    args = runner_args(cfg, "train.py", "runs/x/resolved_config.yml")
    # the hostfile's slots decide the processes per host (a disagreeing num-gpus is refused before this:
    # tests/unit/test_cluster_launch.py), and deepy.py asked every host over ssh already
    assert args == ["--hostfile", os.path.join(ROOT, "configs/cluster/hostfile.example"), "--num_nodes", "2",
                    "--master_addr", "node001", "--no_ssh_check", "--master_port", "29600", "--launcher", "slurm",
                    "--log_level", "warning", "train.py", "--resolved-config", "runs/x/resolved_config.yml"]


def test_include_replaces_num_gpus(tiny_config):
    cfg = tiny_config(include="localhost:0,1", num_gpus=2)
    args = runner_args(cfg, "train.py", "r.yml")
    assert "--include" in args and "--num_gpus" not in args


def test_one_process_on_cpu_by_default(tiny_config):
    # a CPU run (the suite pins DS_ACCELERATOR=cpu): one process, on a GPU machine too
    assert processes_per_node(tiny_config()) == 1
    assert processes_per_node(tiny_config(num_gpus=2)) == 2


def test_debug_reaches_the_training_processes(tiny_config, monkeypatch):
    """deepy.py --debug sets KERPLE_DEBUG=1; the runner exports few variables to other nodes, so
    the flag travels on the training script's command line."""
    from megatron.errors import DEBUG_ENV

    monkeypatch.delenv(DEBUG_ENV, raising=False)
    assert "--debug" not in runner_args(tiny_config(), "train.py", "r.yml")
    monkeypatch.setenv(DEBUG_ENV, "1")
    assert runner_args(tiny_config(), "train.py", "r.yml")[-4:] == ["train.py", "--resolved-config", "r.yml", "--debug"]


def test_overrides_refuse_a_key_twice_and_bad_yaml():
    from megatron.config.overrides import parse_overrides

    assert parse_overrides(["num-layers=2", "pos-emb=rotary"]) == {"num-layers": 2, "pos-emb": "rotary"}
    with pytest.raises(ConfigError, match="'num_layers' is given twice"):
        parse_overrides(["num-layers=2", "num_layers=4"])
    with pytest.raises(ConfigError, match="not valid YAML"):
        parse_overrides(["optimizer={type: Adam"])


def test_eval_switches_reach_eval_py_without_a_value():
    """deepy.py eval.py ... --overwrite: passed on as the bare switch (a 'True' after it would be
    read by eval.py as a config file)."""
    from megatron.evaluation.harness.cli import eval_argv
    from megatron.launch.launcher import parse_args

    args = parse_args(["eval.py", "a.yml", "--eval_tasks", "t1", "t2", "--overwrite", "--limit", "3"])
    assert eval_argv(args, args.parser) == ["--eval_tasks", "t1", "t2", "--limit", "3.0", "--overwrite"]
