"""`kill -INT` to deepy.py with two workers under DeepSpeed's runner reaches the workers: they save at
the next step boundary, release the locks and exit, and deepy.py exits 130 only after every process
it started has ended, naming the checkpoint and the locks. Before, deepy.py exited 130 at once while
the launcher and both workers trained on, unsaved, holding the run's lock. (SIGTERM, SIGHUP and
SIGUSR1 take the same path: tests/unit/test_launch_signals.py.)"""
import os
import signal
import subprocess
import sys
import time

import psutil

from megatron.checkpoint.tags import read_latest
from tests.conftest import ROOT, train_config_dict
from tests.integration.fault_helpers import last_iteration, start_deepy, write_config


def _alive(procs) -> list:
    alive = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:  # ended between the two questions
            pass
    return alive


def test_sigint_to_deepy_reaches_both_workers_which_save_and_exit_before_it(tmp_path, token_dataset):
    run, ck = tmp_path / "run", str(tmp_path / "ck")
    conf = write_config(tmp_path, "dp2", train_config_dict(
        tmp_path, token_dataset, train_iters=400, num_gpus=2, run_dir=str(run), save=ck, save_interval=1000,
        eval_iters=1))
    proc = start_deepy(conf)
    tree = []
    try:
        deadline = time.time() + 240
        while last_iteration(run) < 2 and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        tree = psutil.Process(proc.pid).children(recursive=True)  # runner's launcher, the workers, ...
        assert os.getpgid(tree[0].pid) != os.getpgid(proc.pid)  # a terminal's Ctrl-C reaches deepy.py alone
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
        assert _alive(tree) == [], [p.cmdline() for p in _alive(tree)]  # none outlives deepy.py
        assert proc.returncode == 130, out[-3000:]
        assert out.count("[signal] Ctrl-C: saving at the end of this step") == 2, out[-3000:]  # once to each worker
        assert "second Ctrl-C" not in out and "Traceback" not in out, out[-3000:]
        stopped = last_iteration(run)
        assert 2 <= stopped < 400 and read_latest(ck) == f"global_step{stopped}", out[-3000:]
        assert (f"deepy.py: stopped by SIGINT: every training process has exited; saved global_step{stopped} "
                f"({ck}/latest names it); the run's locks are released") in out, out[-3000:]
        assert not (run / "train.lock").read_text() and not open(ck + ".lock").read()  # both released
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in _alive(tree):  # the workers a dead launcher left behind
            p.kill()


def test_a_signal_before_any_worker_started_ends_the_launcher():
    """Nothing to pass the signal to (the runner has not started its launcher yet): the signal is
    not swallowed, the launcher ends as it would have without the forwarding."""
    code = ("import os, signal, sys, time; sys.path.insert(0, sys.argv[1])\n"
            "from megatron.launch.signals import Supervisor\n"
            "with Supervisor(None):\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    time.sleep(30)\n")
    proc = subprocess.run([sys.executable, "-c", code, ROOT], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGTERM, proc.stderr[-2000:]
