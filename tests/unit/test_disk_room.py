"""Issue 23: a full disk under run-dir at start ended in an OSError naming no path (or a logger's
traceback). The start now says which directory, how much is free there and the fix, exit 1."""
import errno
import shutil

import pytest

from megatron import errors
from megatron.process import disk
from tests.unit.test_evaluate_oom import patched  # noqa: F401 - the fixture: evaluate.py on a stand-in model


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
    assert not (tmp_path / "ck").exists()  # the probe is removed, and the directory the check made (a refusal writes nothing)


def test_the_trainer_checks_before_its_lock(tmp_path, monkeypatch, token_dataset):
    from megatron.config import load_config
    from megatron.training.trainer import Trainer
    from tests.conftest import train_config_dict, write_yaml

    cfg = load_config([write_yaml(tmp_path / "t.yml", train_config_dict(tmp_path, token_dataset))])
    _full(monkeypatch)
    with pytest.raises(disk.DiskFull, match=r"run-dir .*the disk is full"):
        Trainer(cfg)
    assert not (tmp_path / "run" / "train.lock").exists()


# Issue 35, class 5: "the disk is full" named no path when the system's error named none (a write()
# into an open file), and not what was kept.
def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")  # as file.write raises it: no file name


def test_a_full_disk_without_a_file_name_still_says_where(tmp_path):
    from megatron.atomic_io import atomic_output

    target = tmp_path / "results.json"
    target.write_text("earlier")
    with pytest.raises(OSError) as e, atomic_output(str(target)) as tmp, open(tmp, "w"):
        _no_space()
    message = errors.describe_os_error(e.value)
    assert f"the disk is full writing '{target}'" in message and target.read_text() == "earlier"
    bare = errors.describe_os_error(OSError(errno.EDQUOT, "Disk quota exceeded"))  # a quota is a full disk too
    assert bare.startswith("the disk is full (the system named no file;") and "free space" in bare


@pytest.mark.usefixtures("patched")
def test_evaluate_on_a_full_disk_names_the_results_it_kept(tmp_path, monkeypatch):
    from megatron.atomic_io import atomic_output
    from megatron.evaluation import sweep as evaluate

    monkeypatch.setattr(evaluate, "write_outputs", _no_space)  # every length done, eval.json cannot be written
    argv = ["--checkpoint", str(tmp_path / "ck"), "--lengths", "32,64", "--out", str(tmp_path / "eval"), "--quiet"]
    with pytest.raises(errors.DiskFull, match=rf"the disk is full writing the results into '{tmp_path}/eval' "
                                              r"\(.* MiB free there\); lengths 32, 64 finished and are kept in "
                                              rf"{tmp_path}/eval/eval.partial.json; free space there"):
        evaluate.main(argv)
    assert errors.DiskFull.exit_code == errors.EXIT_SYSTEM_ERROR
    real = atomic_output
    writes = []

    def full_at_second_length(path, fsync=True):  # the second length's partial save finds the disk full
        writes.append(path)
        if len(writes) == 2:
            _no_space()
        return real(path, fsync)

    monkeypatch.setattr(evaluate, "atomic_output", full_at_second_length)
    with pytest.raises(errors.DiskFull, match=r"lengths 32 finished and are kept in .*eval.partial.json"):
        evaluate.main([*argv, "--overwrite"])


def test_preprocess_on_a_full_disk_names_the_dataset_it_kept(tmp_path, monkeypatch):
    from megatron.data import indexed
    from megatron.data.preprocess import preprocess
    from megatron.tokenizer import build_tokenizer

    src = tmp_path / "a.jsonl"
    src.write_text('{"text": "hello"}\n')
    tok = build_tokenizer("CharLevelTokenizer")
    preprocess([str(src)], tok, str(tmp_path / "x"))
    before = (tmp_path / "x_text_document.bin").read_bytes()
    monkeypatch.setattr(indexed.MMapIndexedDatasetBuilder, "add_item", _no_space)
    with pytest.raises(errors.DiskFull, match=rf"the disk is full writing the dataset '{tmp_path}/x_text_document'"
                                              r".*nothing was written: the existing .*x_text_document.bin/.idx are "
                                              r"unchanged; free space there"):
        preprocess([str(src)], tok, str(tmp_path / "x"), overwrite=True)
    assert (tmp_path / "x_text_document.bin").read_bytes() == before
