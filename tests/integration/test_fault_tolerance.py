"""Crashes and pre-emption: a run killed (SIGKILL) at a random step, or in the middle of a save,
resumes to exactly the losses of an uninterrupted run, and `latest` never names a partial
checkpoint. SIGTERM saves at the next step boundary and exits cleanly. Every run here uses
dropout, so the resumed losses are exact only if the dropout masks are too."""
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from megatron.checkpoint.reader import read_tp1_state
from megatron.checkpoint.tags import read_latest, step_of
from tests.conftest import ROOT, train_config_dict
from tests.integration.fault_helpers import child_env, last_iteration, train_losses, write_config

ITERS = 10


def config(tmp_path, token_dataset, name):
    ck = str(tmp_path / f"{name}_ck")
    data = train_config_dict(tmp_path, token_dataset, train_iters=ITERS, save=ck, load=ck, save_interval=2,
                             keep_last_n_checkpoints=2, run_dir=str(tmp_path / name), gradient_accumulation_steps=2,
                             hidden_dropout=0.1, attention_dropout=0.1)
    return write_config(tmp_path, name, data), ck, tmp_path / name


def start(cfg_path, script=None):
    args = [sys.executable, script or os.path.join(ROOT, "train.py"), cfg_path]
    return subprocess.Popen(args, cwd=ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc, timeout=240):
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


@pytest.fixture
def reference(tmp_path, token_dataset):
    cfg, _, run = config(tmp_path, token_dataset, "reference")
    rc, out = finish(start(cfg))
    assert rc == 0, out[-3000:]
    losses = train_losses(run)
    assert sorted(losses) == list(range(1, ITERS + 1))
    return losses


def signal_at_step(proc, run, step: int, signum: int):
    """Send `signum` once the run has logged `step` (or the child ended, or 180 s passed)."""
    deadline = time.time() + 180
    while last_iteration(run) < step and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signum)
    return proc


def assert_latest_complete(ck):
    tag = read_latest(ck)
    read = read_tp1_state(ck, tag)  # reads and unpickles the whole file
    assert read.client["iteration"] == step_of(tag) and read.state
    assert os.path.isfile(os.path.join(read.tag_dir, "resolved_config.yml"))


def assert_each_step_once(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        steps = [row["iteration"] for row in map(json.loads, f) if row["kind"] == "train"]
    assert steps == list(range(1, ITERS + 1)), steps


def assert_same_losses(run, reference):
    resumed = train_losses(run)
    assert sorted(resumed) == list(range(1, ITERS + 1))
    for it, loss in resumed.items():
        assert loss == pytest.approx(reference[it], abs=1e-6), (it, loss, reference[it])


def test_sigkill_at_random_step_then_resume(tmp_path, token_dataset, reference):
    cfg, ck, run = config(tmp_path, token_dataset, "killed")
    kill_at = random.Random().randint(3, ITERS - 2)
    print(f"killing after iteration {kill_at}")
    proc = start(cfg)
    deadline = time.time() + 180
    while last_iteration(run) < kill_at and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert_latest_complete(ck)
    rc, out = finish(start(cfg))
    assert rc == 0, out[-3000:]
    assert "[checkpoint] loaded" in out
    assert_same_losses(run, reference)
    assert_each_step_once(run)  # the steps after the checkpoint were logged, then redone


# A child that dies (SIGKILL) in the middle of its second save: either after DeepSpeed wrote a
# torn model file, or after every file was written but before the directory was published.
KILL_DURING_SAVE = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {root!r})
    import torch
    saves = {{"n": 0}}
    real_save, real_replace = torch.save, os.replace
    def torn_save(obj, f, *a, **k):
        real_save(obj, f, *a, **k)
        if {mode!r} == "torn" and isinstance(f, str) and ".incomplete" in f and "model_states" in f:
            saves["n"] += 1
            if saves["n"] == 2:
                os.truncate(f, os.path.getsize(f) // 2)
                os.kill(os.getpid(), signal.SIGKILL)
    def late_replace(src, dst):
        if {mode!r} == "unpublished" and str(src).endswith(".incomplete"):
            saves["n"] += 1
            if saves["n"] == 2:
                os.kill(os.getpid(), signal.SIGKILL)
        return real_replace(src, dst)
    torch.save, os.replace = torn_save, late_replace
    sys.argv = ["train.py", sys.argv[1]]
    import runpy
    runpy.run_path(os.path.join({root!r}, "train.py"), run_name="__main__")
""")


@pytest.mark.parametrize("mode", ["torn", "unpublished"])
def test_sigkill_during_save_then_resume(tmp_path, token_dataset, reference, mode):
    cfg, ck, run = config(tmp_path, token_dataset, f"save_{mode}")
    script = tmp_path / "kill_during_save.py"
    script.write_text(KILL_DURING_SAVE.format(root=ROOT, mode=mode))
    rc, out = finish(start(cfg, str(script)))
    assert rc == -signal.SIGKILL, out[-3000:]
    assert read_latest(ck) == "global_step2"  # the second save (step 4) never got published
    assert os.path.isdir(os.path.join(ck, "global_step4.incomplete"))
    assert_latest_complete(ck)
    rc, out = finish(start(cfg))
    assert rc == 0, out[-3000:]
    assert not any(d.endswith(".incomplete") for d in os.listdir(ck))
    assert_same_losses(run, reference)


def test_sigterm_saves_at_step_boundary_and_exits(tmp_path, token_dataset, reference):
    cfg, ck, run = config(tmp_path, token_dataset, "term")
    proc = signal_at_step(start(cfg), run, 3, signal.SIGTERM)
    rc, out = finish(proc)
    assert rc == 0, out[-3000:]
    assert "[signal] received signal" in out
    stopped = last_iteration(run)
    assert 3 <= stopped < ITERS and read_latest(ck) == f"global_step{stopped}"
    assert_latest_complete(ck)
    rc, out = finish(start(cfg))
    assert rc == 0, out[-3000:]
    assert_same_losses(run, reference)


def test_ctrl_c_saves_at_step_boundary_exits_130_then_resumes(tmp_path, token_dataset, reference):
    cfg, ck, run = config(tmp_path, token_dataset, "ctrl_c")
    proc = signal_at_step(start(cfg), run, 3, signal.SIGINT)
    rc, out = finish(proc)
    assert rc == 130, out[-3000:]
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-3000:]
    stopped = last_iteration(run)
    assert 3 <= stopped < ITERS and read_latest(ck) == f"global_step{stopped}", out[-3000:]
    assert_latest_complete(ck)
    rc, out = finish(start(cfg))
    assert rc == 0, out[-3000:]
    assert_same_losses(run, reference)
    assert_each_step_once(run)
