"""Checkpoints are never overwritten or misread silently: a checkpoint directory that lost its
`latest` is refused (not trained over from scratch), a fresh run into a `save` directory that
already holds another run's steps is refused unless asked to start over, and a weights-only
(merged / converted) checkpoint is refused as a resume point with the way to start from it."""
import os
import shutil
import subprocess
import sys

import pytest

from megatron.checkpoint.errors import CheckpointError
from megatron.checkpoint.tags import read_latest
from megatron.config import load_config
from tests.conftest import ROOT, hyphenate, write_yaml
from tests.integration.fault_helpers import child_env, train_checkpoint


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(config dict, checkpoint dir holding global_step2 and global_step4, latest -> global_step4)."""
    return train_checkpoint(tmp_path_factory.mktemp("overwrite"))


@pytest.fixture
def ck(trained, tmp_path):
    dst = str(tmp_path / "ck")
    shutil.copytree(trained[1], dst)
    return dst


def _config(trained, tmp_path, **over) -> str:
    conf = hyphenate({**trained[0], "run-dir": str(tmp_path / "run"), **over})
    return write_yaml(tmp_path / "again.yml", conf)


def _trainer(trained, tmp_path, **over):
    from megatron.training.trainer import Trainer

    return Trainer(load_config([_config(trained, tmp_path, **over)]))


def test_missing_latest_is_refused_naming_the_steps(trained, ck, tmp_path):
    os.remove(os.path.join(ck, "latest"))
    with pytest.raises(CheckpointError) as e:
        _trainer(trained, tmp_path, save=ck, load=ck, train_iters=6)
    msg = str(e.value)
    assert "global_step2, global_step4" in msg and "no `latest`" in msg, msg
    assert "iteration: 4" in msg and "overwrite-checkpoints: true" in msg, msg
    assert sorted(os.listdir(ck)) == ["global_step2", "global_step4"]  # nothing was touched
    # the fix the message names: pick the step, and the run resumes from it
    assert _trainer(trained, tmp_path, save=ck, load=ck, train_iters=6, iteration=4).iteration == 4


def test_missing_latest_through_train_py_is_one_message(trained, ck, tmp_path):
    os.remove(os.path.join(ck, "latest"))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"),
                           _config(trained, tmp_path, save=ck, load=ck, train_iters=6)],
                          capture_output=True, text=True, cwd=ROOT, env=child_env(), timeout=300)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "starting from scratch" not in proc.stdout, proc.stderr[-3000:]
    assert "global_step2, global_step4" in proc.stderr, proc.stderr[-3000:]


def test_fresh_run_into_a_save_dir_with_steps_is_refused_unless_starting_over(trained, ck, tmp_path):
    with pytest.raises(CheckpointError, match=r"already holds checkpoints global_step2, global_step4"):
        _trainer(trained, tmp_path, save=ck, load=None, train_iters=2)
    assert read_latest(ck) == "global_step4"
    trainer = _trainer(trained, tmp_path, save=ck, load=None, train_iters=2, overwrite_checkpoints=True)
    assert trainer.iteration == 0 and not os.path.exists(os.path.join(ck, "latest"))
    trainer.train()
    assert sorted(os.listdir(ck)) == ["global_step2", "latest"] and read_latest(ck) == "global_step2"


def test_merged_checkpoint_is_weights_only_and_says_how_to_start_from_it(trained, tmp_path):
    merged = str(tmp_path / "merged")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "merge_tp_checkpoint.py"), "--input",
                           trained[1], "--output", merged], capture_output=True, text=True, cwd=ROOT,
                          env=child_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    weights_only = r"holds the weights only, no optimizer state .*`finetune: true`.*`no-load-optim: true`"
    with pytest.raises(CheckpointError, match=weights_only):
        _trainer(trained, tmp_path, save=None, load=merged, train_iters=6)
    with pytest.raises(CheckpointError, match=r"holds the weights only"):  # ZeRO would start a fresh optimizer silently
        _trainer(trained, tmp_path, save=None, load=merged, train_iters=6, zero_optimization={"stage": 2})
    assert _trainer(trained, tmp_path, save=None, load=merged, train_iters=6, finetune=True).iteration == 0
    assert _trainer(trained, tmp_path, save=None, load=merged, train_iters=6, no_load_optim=True).iteration == 4


def test_a_finetune_started_again_is_told_how_to_resume_it(trained, ck, tmp_path):
    """Issue 54 item 8: the same fine-tune command again was told `load: <its own checkpoints>`, which
    was refused again; neither message said that a resume also needs `finetune: false`."""
    own = str(tmp_path / "ft")
    first = _trainer(trained, tmp_path, load=ck, save=own, finetune=True, train_iters=2, save_interval=2)
    first.train()
    with pytest.raises(CheckpointError) as again:
        _trainer(trained, tmp_path, load=ck, save=own, finetune=True, train_iters=2, save_interval=2)
    assert f"resume them with `load: {own}` and `finetune: false`" in str(again.value)
    with pytest.raises(ValueError) as half:  # the advice half followed: load set, finetune still on
        _trainer(trained, tmp_path, load=own, save=own, finetune=True, train_iters=2, save_interval=2)
    assert f"keep `load: {own}` and `finetune: false`" in str(half.value)
    resumed = _trainer(trained, tmp_path, load=own, save=own, finetune=False, train_iters=2, save_interval=2)
    try:
        assert resumed.iteration == 2  # the fine-tune's own step, resumed
    finally:
        resumed.release()
