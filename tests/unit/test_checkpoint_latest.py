"""The `latest` file (plain tags only, atomic writes, stale temp files) and the NaN/inf check."""
import os
import subprocess
import sys

import pytest
import torch

from megatron.checkpoint.errors import CheckpointError
from megatron.checkpoint.finite import check_finite, nonfinite_tensors
from megatron.checkpoint.tags import check_tag, clean_stale_tmp, read_latest, resolve_tag, write_latest


@pytest.mark.parametrize("tag", ["../../elsewhere/global_step40", "/abs/global_step40", "sub/global_step40",
                                 "..", ".", "a\\b"])
def test_latest_outside_the_directory_is_refused(tmp_path, tag):
    ck = tmp_path / "ck"
    (ck / "sub" / "global_step40").mkdir(parents=True)
    (tmp_path / "elsewhere" / "global_step40").mkdir(parents=True)
    (ck / "latest").write_text(tag)
    with pytest.raises(CheckpointError, match=rf"{ck / 'latest'} names checkpoint .*not the plain name of a step "
                                              r"directory inside .*global_step<N>"):
        read_latest(str(ck))
    with pytest.raises(CheckpointError, match="not the plain name"):
        check_tag(tag, str(ck), "--iteration")


def test_plain_tag_and_missing_latest(tmp_path):
    (tmp_path / "global_step4").mkdir()
    assert read_latest(str(tmp_path)) is None
    write_latest(str(tmp_path), "global_step4")
    assert read_latest(str(tmp_path)) == resolve_tag(str(tmp_path)) == "global_step4"
    assert sorted(os.listdir(tmp_path)) == ["global_step4", "latest"]
    (tmp_path / "latest").write_text("")
    with pytest.raises(CheckpointError, match="latest is empty"):
        read_latest(str(tmp_path))


def test_stale_latest_tmp_is_removed_but_a_live_writers_is_kept(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / f"latest.tmp{dead.pid}").write_text("global_step2")
        (tmp_path / f"latest.tmp{live.pid}").write_text("global_step4")
        (tmp_path / f"latest.tmp{os.getpid()}").write_text("global_step6")  # ours, but we are not writing
        (tmp_path / "global_step8").mkdir()
        write_latest(str(tmp_path), "global_step8")
        assert sorted(os.listdir(tmp_path)) == ["global_step8", "latest", f"latest.tmp{live.pid}"]
    finally:
        live.kill()
        live.wait()
    assert clean_stale_tmp(str(tmp_path)) == [str(tmp_path / f"latest.tmp{live.pid}")]


def test_nonfinite_tensors_are_named():
    state = {"module": {"a.weight": torch.ones(3), "b.weight": torch.tensor([1.0, float("nan")]),
                        "steps": torch.tensor([1, 2])},
             "optimizer": {"state": {0: {"exp_avg": torch.tensor([float("inf")])}}}}
    assert nonfinite_tensors(state) == ["module.b.weight", "optimizer.state.0.exp_avg"]
    with pytest.raises(CheckpointError, match=r"x\.pt holds non-finite values \(NaN or inf\) in module\.b\.weight, "
                                              r"optimizer\.state\.0\.exp_avg.*--allow-nonfinite.*allow-nonfinite-weights"):
        check_finite(state, "x.pt")
    check_finite(state, "x.pt", allow=True)
    check_finite({"module": {"a": torch.ones(2, dtype=torch.bfloat16)}}, "y.pt")


def test_tool_write_failure_is_one_clear_error(tmp_path, monkeypatch):
    """merge/convert write with torch_save_file: a full disk names the file, the partial is removed."""
    import megatron.checkpoint.writer as writer

    def disk_full(obj, path):
        open(path, "wb").close()
        raise RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file "
                           "data/0: file write failed")

    monkeypatch.setattr(writer.torch, "save", disk_full)
    monkeypatch.setattr(writer, "free_bytes", lambda path: 0)
    path = str(tmp_path / "mp_rank_00_model_states.pt")
    with pytest.raises(writer.CheckpointSaveError, match=rf"could not write {path}: the disk is full \(.*file "
                                                             r"write failed; 0 MiB free there\); `latest` next to it "
                                                             r"was not changed"):
        writer.torch_save_file({"a": 1}, path)
    assert os.listdir(tmp_path) == []


def test_trust_flag_reaches_the_training_processes(tiny_config, monkeypatch):
    """deepy.py --trust-checkpoint: the launched train.py processes (other nodes too) get the flag."""
    from megatron.checkpoint.trust import apply_trust_flag
    from megatron.launch.launcher import parse_args, runner_args

    monkeypatch.setenv("KERPLE_TRUST_CHECKPOINT", "")  # restored (unset) after the test
    cfg = tiny_config()
    assert runner_args(cfg, "train.py", "r.yml")[-1] == "r.yml"
    apply_trust_flag(parse_args(["train.py", "a.yml", "--trust-checkpoint"]))
    assert runner_args(cfg, "train.py", "r.yml")[-3:] == ["--resolved-config", "r.yml", "--trust-checkpoint"]
    assert os.environ["KERPLE_TRUST_CHECKPOINT"] == "1"
