"""Whole-directory outputs (megatron/atomic_io.py): refused when present unless asked, published at
once, untouched by a failed write, and a killed writer's temporary directory cleaned up."""
import os
import subprocess
import sys

import pytest

from megatron.atomic_io import OutputExists, atomic_directory, refuse_existing_output


def test_existing_output_is_refused_unless_overwrite(tmp_path):
    (tmp_path / "empty").mkdir()
    refuse_existing_output(str(tmp_path / "empty"), False, "--out")  # nothing to lose
    refuse_existing_output(str(tmp_path / "new"), False, "--out")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("1")
    with pytest.raises(OutputExists, match=r"--out .*full already exists and holds things; refusing .*--overwrite"):
        refuse_existing_output(str(tmp_path / "full"), False, "--out", "things")
    refuse_existing_output(str(tmp_path / "full"), True, "--out")


def test_a_failed_write_leaves_the_old_directory_and_a_finished_one_replaces_it_whole(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old").write_text("earlier")
    with pytest.raises(RuntimeError), atomic_directory(str(out)) as tmp:
        open(os.path.join(tmp, "new"), "w").close()
        raise RuntimeError("killed half way")
    assert sorted(os.listdir(tmp_path)) == ["out"] and os.listdir(out) == ["old"]
    with atomic_directory(str(out)) as tmp:
        open(os.path.join(tmp, "new"), "w").close()
    assert sorted(os.listdir(tmp_path)) == ["out"] and os.listdir(out) == ["new"]


def test_a_killed_writers_temporary_directory_is_removed_by_the_next(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"out.tmp{dead.pid}"
    stale.mkdir()
    (stale / "half").write_text("x")
    with atomic_directory(str(tmp_path / "out")) as tmp:
        open(os.path.join(tmp, "new"), "w").close()
    assert sorted(os.listdir(tmp_path)) == ["out"]
