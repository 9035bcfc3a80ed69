"""One run per run directory: a second holder is refused with the first one's pid/host/start, and
the lock file of a killed holder (SIGKILL releases the flock) is taken over."""
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from megatron.process.run_lock import RunDirInUse, RunLock
from tests.conftest import ROOT

HOLD = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from megatron.process.run_lock import RunLock
    lock = RunLock(sys.argv[1]).acquire()
    print("locked", flush=True)
    time.sleep(120)
""")


def hold_in_child(run_dir) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD.format(root=ROOT), str(run_dir)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_second_holder_refused_then_stale_lock_taken_over(tmp_path):
    child = hold_in_child(tmp_path / "run")
    try:
        with pytest.raises(RunDirInUse) as err:
            RunLock(str(tmp_path / "run")).acquire()
        message = str(err.value)
        assert f"pid {child.pid}" in message and socket.gethostname() in message and "since" in message
        assert "run-dir" in message  # the fix
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    lock = RunLock(str(tmp_path / "run")).acquire()  # the killed holder's file is still there
    assert lock.stale and lock.stale["pid"] == child.pid
    lock.release()


def test_released_lock_is_not_stale(tmp_path):
    with RunLock(str(tmp_path)):
        pass
    with RunLock(str(tmp_path)) as again:
        assert again.stale is None
    assert os.path.isfile(tmp_path / "train.lock")  # kept: deleting it would race a new holder


def test_an_output_directory_keeps_no_eval_lock_after_the_evaluation(tmp_path):
    """Issue 45: eval.lock stayed in every results folder. While held it refuses a second evaluation;
    released, it is gone, from a folder that already held results as from a new one."""
    from megatron.evaluation.outputs import LOCK_NAME, output_lock, output_locks

    existing, new = tmp_path / "eval", tmp_path / "new" / "eval"
    existing.mkdir()
    (existing / "eval.json").write_text("{}")
    with output_locks([str(existing), str(new)]):
        assert (existing / LOCK_NAME).exists() and (new / LOCK_NAME).exists()
        for d in (existing, new):
            with pytest.raises(RunDirInUse, match="is in use by another evaluation"):
                output_lock(str(d)).acquire()
            with pytest.raises(RunDirInUse, match="is in use by another evaluation"):
                output_lock(str(d)).check_free()
    assert sorted(os.listdir(existing)) == ["eval.json"]
    assert not (tmp_path / "new").exists()  # made for this run, left empty: removed
    with output_lock(str(existing)):  # free again
        pass
    assert sorted(os.listdir(existing)) == ["eval.json"]


def test_a_removed_lock_file_is_not_locked_by_two(tmp_path, monkeypatch):
    """B opens eval.lock while A holds it; A releases (deleting the file) before B locks. B must not
    keep the deleted file's lock: C, locking the new file at the path, would run beside B."""
    import megatron.process.run_lock as run_lock
    from megatron.evaluation.outputs import output_lock

    a = output_lock(str(tmp_path)).acquire()
    real_open, calls = os.open, []

    def open_then_a_releases(path, *args):
        fd = real_open(path, *args)
        calls.append(path)
        if len(calls) == 1:
            a.release()  # between B's open and B's flock
        return fd

    monkeypatch.setattr(run_lock.os, "open", open_then_a_releases)
    b = output_lock(str(tmp_path)).acquire()
    monkeypatch.setattr(run_lock.os, "open", real_open)
    assert len(calls) == 2  # B saw its file removed and locked the path's new one
    with pytest.raises(RunDirInUse):
        output_lock(str(tmp_path)).acquire()  # C
    b.release()
    assert os.listdir(tmp_path) == []


def test_a_run_directory_lock_file_stays(tmp_path):
    """train.lock is never deleted (a run directory is not a results folder)."""
    with RunLock(str(tmp_path)):
        pass
    assert os.listdir(tmp_path) == ["train.lock"]
