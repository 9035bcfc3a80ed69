"""A second train.py on the run directory of a running one is refused, naming the first."""
import os
import signal
import subprocess
import sys
import time

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
