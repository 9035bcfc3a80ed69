"""deepy.py's side of a stop, on a stand-in process tree (no torch: a fraction of a second each): a
signal reaches the worker under a launcher named as DeepSpeed's (not the launcher), deepy.py waits
for the tree and names what was kept; a worker that does not exit within the grace period is
SIGKILLed and named; Ctrl-Z stops the launched group too and `fg` continues it."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil

from tests.conftest import ROOT

# The worker: records the signals it gets; exits 130 after SIGINT unless told to ignore signals.
WORKER = textwrap.dedent("""
    import os, signal, sys, time
    def handle(signum, frame):
        os.write(1, f"worker got {signal.Signals(signum).name}\\n".encode())  # one write: the pipe is shared
        if sys.argv[1] == "obey":
            os._exit(130)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handle)
    print("worker ready", flush=True)
    while True:
        time.sleep(0.05)
""")
# The launcher: started as `python -c ... deepspeed.launcher.launch` (the name deepy.py looks for);
# like DeepSpeed's, it waits for its worker and exits with its status.
LAUNCHER = "import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-c', sys.argv[2], sys.argv[3]]))"
DEEPY = textwrap.dedent("""
    import subprocess, sys
    sys.path.insert(0, {root!r})
    from megatron.launch.signals import Supervisor, launcher_in_own_group

    class Report:
        def mark(self): sys.stdout.write("marked\\n"); sys.stdout.flush()
        def summary(self): return "SUMMARY"
        def record_outcome(self): pass

    class Runner:  # stands in for deepspeed.launcher.runner: Popen through its module's `subprocess`
        subprocess = subprocess

    sup = Supervisor(Report(), grace_s={grace})
    with sup, launcher_in_own_group(Runner):
        p = Runner.subprocess.Popen([sys.executable, "-c", {launcher!r}, "deepspeed.launcher.launch", {worker!r},
                                     {mode!r}])
        rc = p.wait()
    sys.exit(sup.exit_code or rc)
""")


def start(mode: str, grace: float) -> subprocess.Popen:
    code = DEEPY.format(root=ROOT, grace=grace, launcher=LAUNCHER, worker=WORKER, mode=mode)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def tree_when_ready(proc) -> list:
    deadline = time.time() + 30
    while time.time() < deadline:
        tree = psutil.Process(proc.pid).children(recursive=True)
        if len(tree) == 2:
            line = proc.stdout.readline()
            assert line.strip() == "worker ready", line
            return tree  # [launcher, worker]
        time.sleep(0.02)
    raise AssertionError("the stand-in launcher and worker did not start")


def ended(*procs) -> bool:
    """Each has exited (a zombie too: an orphan that this container's init has not reaped yet)."""
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


def wait_status(p, status: str) -> None:
    deadline = time.time() + 10
    while p.status() != status and time.time() < deadline:
        time.sleep(0.02)
    assert p.status() == status


def test_sigint_reaches_the_worker_once_and_deepy_waits_for_it():
    proc = start("obey", grace=60)
    launcher, worker = tree_when_ready(proc)
    assert os.getpgid(launcher.pid) != os.getpgid(proc.pid)  # the terminal's Ctrl-C reaches deepy.py only
    proc.send_signal(signal.SIGTSTP)  # Ctrl-Z: all of it stops; `fg` continues all of it
    wait_status(worker, psutil.STATUS_STOPPED)
    wait_status(psutil.Process(proc.pid), psutil.STATUS_STOPPED)
    proc.send_signal(signal.SIGCONT)
    wait_status(worker, psutil.STATUS_SLEEPING)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130, out
    assert out.count("worker got SIGINT") == 1 and "marked" in out, out
    assert "deepy.py: stopped by SIGINT: every training process has exited; SUMMARY" in out, out
    assert ended(launcher, worker)


def test_a_worker_that_does_not_stop_is_killed_after_the_grace_period():
    proc = start("ignore", grace=1)
    launcher, worker = tree_when_ready(proc)
    start_time = time.time()
    proc.send_signal(signal.SIGHUP)
    out, _ = proc.communicate(timeout=30)
    assert 1 <= time.time() - start_time < 10, out
    assert proc.returncode == 128 + signal.SIGKILL, out
    assert "worker got SIGHUP" in out, out
    assert (f"did not exit within 1 s: killed (SIGKILL) {worker.pid}" in out or
            f"did not exit within 1 s: killed (SIGKILL) {launcher.pid}" in out) and "; SUMMARY" in out, out
    assert ended(launcher, worker)


def test_a_tool_running_deepy_passes_the_signal_and_waits(tmp_path):
    """tools/run_matrix.py runs deepy.py with run_child: a signal to the tool reaches the child once
    and the tool waits while it saves. subprocess.call SIGKILLed it on Ctrl-C, mid-save."""
    import threading

    import pytest

    from megatron.errors import UserError
    from study.run_matrix import run

    saved = tmp_path / "saved"
    child = textwrap.dedent(f"""
        import os, signal, sys, time
        def stop(signum, frame):
            time.sleep(0.3)  # the save
            open({str(saved)!r}, "a").write(signal.Signals(signum).name + "\\n")
            os._exit(130)
        signal.signal(signal.SIGINT, stop)
        open({str(saved)!r} + ".ready", "w").close()
        while True:
            time.sleep(0.05)
    """)

    def interrupt_when_ready():
        while not os.path.exists(str(saved) + ".ready"):
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)  # as `kill -INT` to the tool, or its terminal's Ctrl-C

    threading.Thread(target=interrupt_when_ready, daemon=True).start()
    with pytest.raises(UserError, match=r"(?s)stopped by SIGINT: .* exited 130 after it .*run the same command again") as e:
        run([sys.executable, "-c", child], str(tmp_path / "run.log"))
    assert e.value.exit_code == 130
    assert saved.read_text() == "SIGINT\n"  # reached once, and the save finished
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the tool's own handling is back
