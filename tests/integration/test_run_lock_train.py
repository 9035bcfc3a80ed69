"""A second train.py on the run directory of a running one is refused, naming the first."""
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, train_config_dict
from tests.integration.fault_helpers import child_env, last_iteration, write_config


def test_second_training_run_on_the_same_run_dir_is_refused(tmp_path, token_dataset):
    run = tmp_path / "run"
    cfg = write_config(tmp_path, "long", train_config_dict(tmp_path, token_dataset, train_iters=100000,
                                                           run_dir=str(run), save=str(tmp_path / "ck"),
                                                           save_interval=100000))
    args = [sys.executable, os.path.join(ROOT, "train.py"), cfg]
    first = subprocess.Popen(args, cwd=ROOT, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 180
        while last_iteration(run) < 1 and first.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert first.poll() is None
        second = subprocess.run(args, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=240)
        assert second.returncode != 0
        assert "in use by another training run" in second.stderr and f"pid {first.pid}" in second.stderr, \
            second.stderr[-3000:]
        assert "Traceback" not in second.stderr
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)


def test_a_run_with_its_own_run_dir_but_the_same_save_is_refused(tmp_path, token_dataset):
    """The lock covers what a run writes: its checkpoints too, wherever `save` points."""
    from megatron.config import load_config
    from megatron.process.run_lock import RunDirInUse
    from megatron.training.trainer import Trainer

    def trainer(name):
        conf = train_config_dict(tmp_path, token_dataset, train_iters=2, run_dir=str(tmp_path / name),
                                 save=str(tmp_path / "ck"), save_interval=2)
        return Trainer(load_config([write_config(tmp_path, name, conf)]))

    first = trainer("first")
    try:
        with pytest.raises(RunDirInUse) as e:
            trainer("second")
        msg = str(e.value)
        assert f"checkpoint directory {str(tmp_path / 'ck')!r} is in use" in msg and f"pid {os.getpid()}" in msg, msg
        assert "its own `save` directory" in msg, msg
        # its run-dir lock was released, and the file it made is gone: a refused start changes nothing
        assert not (tmp_path / "second" / "train.lock").exists()
    finally:
        first.release()
    trainer("second").release()  # free again once the first run has ended


def test_deepy_writes_nothing_into_a_live_runs_directories(tmp_path, token_dataset):
    """deepy.py writes resolved_config.yml and configs/ into run-dir before the training process
    takes the lock: it checks the locks first, so a live run's files are never replaced."""
    from megatron.process.run_lock import RunLock

    run = tmp_path / "run"
    run.mkdir()
    (run / "resolved_config.yml").write_text("the live run's\n")
    cfg = write_config(tmp_path, "second", train_config_dict(tmp_path, token_dataset, run_dir=str(run)))
    with RunLock(str(run)):  # the live run
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "deepy.py"), "train.py", cfg], cwd=ROOT,
                              env=child_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "in use by another training run" in proc.stderr and f"pid {os.getpid()}" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert (run / "resolved_config.yml").read_text() == "the live run's\n" and not (run / "configs").exists()
