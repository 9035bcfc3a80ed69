"""One run per run directory: a second holder is refused with the first one's pid/host/start, and
the lock file of a killed holder (SIGKILL releases the flock) is taken over."""
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from megatron.training.run_lock import RunDirInUse, RunLock
from tests.conftest import ROOT

HOLD = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from megatron.training.run_lock import RunLock
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
