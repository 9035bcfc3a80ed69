"""megatron/process/ranks.py: which process of a launch this is, from torch.distributed's variables or
srun's, and the contradictions refused by name; and `deepy.py eval.py` refusing a config that asks
for several processes rather than running one silently."""
import pytest

from megatron.errors import UserError
from megatron.process.ranks import LaunchRanks, claimed_rank, launch_ranks


@pytest.mark.parametrize("env, expected", [
    ({}, (0, 1, 0)),
    ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}, (3, 4, 1)),
    ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_LOCALID": "1"}, (1, 2, 1)),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, (0, 1, 0)),  # the batch script's own shell: no step, one process
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "6", "SLURM_LOCALID": "1"}, (5, 6, 1)),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_STEP_NUM_TASKS": "1"}, (0, 1, 0)),  # one srun task
    # torchrun inside srun (one task per node): the launcher's own variables win
    ({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "SLURM_PROCID": "1", "SLURM_NTASKS": "2"}, (5, 8, 1)),
], ids=["alone", "torch", "srun", "batch-shell", "srun-step", "srun-one-task", "torchrun-in-srun"])
def test_launch_ranks(env, expected):
    assert launch_ranks(env) == LaunchRanks(*expected)


@pytest.mark.parametrize("env, said", [
    ({"RANK": "0", "WORLD_SIZE": "1", "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2"}, "WORLD_SIZE=1 in a Slurm step of 2"),
    ({"RANK": "0"}, "RANK is set but WORLD_SIZE is not"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 is not below WORLD_SIZE=2"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' must be an integer"),
    # issue 54 item 2: partial Slurm variables trained as a world of one and said nothing
    ({"SLURM_STEP_NUM_TASKS": "2"}, "SLURM_STEP_NUM_TASKS=2 but SLURM_PROCID is not set"),
], ids=["world-of-one-under-srun", "no-world-size", "rank-too-big", "not-a-number", "partial-slurm"])
def test_contradictions_are_refused_by_name(env, said):
    with pytest.raises(UserError, match=said.replace("(", r"\(")):
        launch_ranks(env)


def test_claimed_rank_says_who_reports():
    assert claimed_rank({}) == 0 and claimed_rank({"RANK": "2"}) == 2 and claimed_rank({"SLURM_PROCID": "1"}) == 1


def test_deepy_eval_py_refuses_a_config_for_several_processes(tmp_path, monkeypatch, capsys):
    import sys

    from megatron import errors
    from megatron.launch import launcher
    from tests.conftest import ROOT, TINY_MODEL, checkpoint_layout, write_yaml

    ck = checkpoint_layout(tmp_path / "ck")
    config = write_yaml(tmp_path / "c.yml", dict(TINY_MODEL, **{"run-dir": str(tmp_path / "run"), "load": ck,
                                                                  "device": "cpu", "num-gpus": 2}))
    monkeypatch.delenv(errors.DEBUG_ENV, raising=False)
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", ["deepy.py", "eval.py", config, "--eval_tasks", "kerple_local"])
    with pytest.raises(SystemExit) as e:
        errors.run_cli(launcher.main, "deepy.py")
    err = capsys.readouterr().err
    assert e.value.code == 2 and "eval.py runs the lm-evaluation-harness in one process" in err
    assert "num-gpus 2" in err and "deepy.py evaluate.py" in err and not (tmp_path / "run").exists()
