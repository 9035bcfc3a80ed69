"""Issue 23: a full disk under run-dir at start ended in an OSError naming no path (or a logger's
traceback). The start now says which directory, how much is free there and the fix, exit 1."""
import errno
import shutil

import pytest

from megatron import errors
from megatron.training import disk


def _full(monkeypatch, free=3 << 20):
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=free))


def test_a_full_run_dir_is_named_before_anything_is_written(tmp_path, monkeypatch, capsys, token_dataset):
    from tests.conftest import deepy_exit, train_config_dict, write_yaml

    run = tmp_path / "run"
    conf = write_yaml(tmp_path / "c.yml", train_config_dict(tmp_path, token_dataset))
    _full(monkeypatch)
    code, err = deepy_exit(monkeypatch, capsys, conf)
    assert code == errors.EXIT_SYSTEM_ERROR and "Traceback" not in err
    assert f"run-dir '{run}': the disk is full (3 MiB free there" in err and "-o run-dir=" in err
    assert not run.exists() or list(run.iterdir()) == []  # no config, no lock


def test_a_write_refused_by_the_disk_is_named_too(tmp_path, monkeypatch):
    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(disk.os, "fsync", no_space)
    with pytest.raises(disk.DiskFull, match=r"save '.*ck': the disk is full .*-o save="):
        disk.check_room(str(tmp_path / "ck"), "save")
    assert not list((tmp_path / "ck").iterdir())  # the probe is removed


def test_the_trainer_checks_before_its_lock(tmp_path, monkeypatch, token_dataset):
    from megatron.config import load_config
    from megatron.training.trainer import Trainer
    from tests.conftest import train_config_dict, write_yaml

    cfg = load_config([write_yaml(tmp_path / "t.yml", train_config_dict(tmp_path, token_dataset))])
    _full(monkeypatch)
    with pytest.raises(disk.DiskFull, match=r"run-dir .*the disk is full"):
        Trainer(cfg)
    assert not (tmp_path / "run" / "train.lock").exists()
