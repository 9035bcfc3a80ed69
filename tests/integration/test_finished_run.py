"""A finished run started again (issue 34 item 7; issue 52 item 3) does nothing and writes nothing
(megatron/training/finished.py): no metrics row, and its resolved_config.yml, configs/ and TensorBoard
events stay as they were, so the run directory keeps saying how its checkpoint was trained. An
override that differs from that record is named, with both values, by the dry run, the launch and
the trainer alike. A run killed after its last save but before its final evaluation still
evaluates when started again. A normal start speaks with one voice: no library warnings."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys

from megatron.config import load_config
from megatron.process.metrics_file import metrics_path, read_metrics
from tests.conftest import ROOT, train_config_dict, write_token_dataset, write_yaml
from tests.integration.fault_helpers import child_env, free_port

WARNINGS = ("Warning:", "UserWarning", "FutureWarning", "DeprecationWarning")


def snapshot(folder) -> dict[str, str]:
    """{relative path: sha256} of every file under `folder`."""
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, folder)] = hashlib.sha256(f.read()).hexdigest()
    return out


def run(*argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=ROOT, env=child_env(),
                          timeout=300)


def no_library_warnings(proc) -> None:
    said = proc.stdout + proc.stderr
    assert not any(w in said for w in WARNINGS), said[-3000:]


def test_a_finished_run_started_again_changes_nothing_and_names_the_overrides(tmp_path):
    cfg = train_config_dict(tmp_path, write_token_dataset(str(tmp_path / "corpus"), num_docs=40), train_iters=2,
                            save_interval=2, master_port=free_port())
    config = write_yaml(tmp_path / "run.yml", cfg)
    deepy = os.path.join(ROOT, "deepy.py")
    run_dir = cfg["run-dir"]
    # a launcher killed between staging and publishing left its .launch-<pid>/ (issue 54 item 7): removed
    # by the next launch; a live launcher's is kept
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale, live = (os.path.join(run_dir, f".launch-{pid}") for pid in (gone.stdout.strip(), os.getpid()))
    for folder in (stale, live):
        os.makedirs(folder)
        write_yaml(os.path.join(folder, "resolved_config.yml"), {"seed": 1})
    first = run(deepy, "train.py", config)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    no_library_warnings(first)
    assert not os.path.exists(stale) and os.path.isdir(live)
    shutil.rmtree(live)
    before = snapshot(run_dir)
    assert "resolved_config.yml" in before and any(p.startswith("tensorboard") for p in before)

    # the same config again: nothing to do, nothing written, nothing to warn about
    again = run(deepy, "train.py", config)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "this run already finished" in again.stdout and "WARNING" not in again.stdout, again.stdout
    no_library_warnings(again)
    assert snapshot(run_dir) == before

    # an override that differs from the record: named with both values by the dry run and the launch
    for dry in (["--dry-run"], []):
        proc = run(deepy, *dry, "train.py", config, "-o", "lr=3e-4")
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "this run already finished" in proc.stdout, proc.stdout
        assert "optimizer.params.lr 0.003 -> 3e-4" in proc.stdout, proc.stdout
        no_library_warnings(proc)
        assert snapshot(run_dir) == before, dry

    # the trainer started directly on a changed config says the same and writes nothing either
    changed = write_yaml(tmp_path / "changed.yml", {**cfg, "optimizer": {**cfg["optimizer"], "params": {
        **cfg["optimizer"]["params"], "lr": 3e-4}}})
    proc = run(os.path.join(ROOT, "train.py"), changed)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[train] this run already finished" in proc.stdout, proc.stdout
    assert "optimizer.params.lr 0.003 -> 0.0003" in proc.stdout, proc.stdout
    assert snapshot(run_dir) == before

    # raising train-iters is not a finished run: it trains on, and the record takes the new values
    more = run(deepy, "train.py", config, "-o", "train-iters=3", "-o", "lr=3e-4")
    assert more.returncode == 0, more.stderr[-3000:]
    assert "already finished" not in more.stdout
    with open(os.path.join(run_dir, "resolved_config.yml")) as f:
        assert "train_iters: 3" in f.read()


def test_dry_run_of_a_fresh_config_prints_no_library_warning():
    """torch warned 'Initializing zero-element tensors is a no-op' on every start: the parameter count
    built the vocabulary with 0 rows when padded-vocab-size was unset."""
    proc = run(os.path.join(ROOT, "deepy.py"), "--dry-run", "train.py", os.path.join(ROOT, "configs", "quickstart.yml"))
    assert "parameters: " in proc.stdout, proc.stdout + proc.stderr
    no_library_warnings(proc)


def _run(cfg_path, capsys=None):
    from megatron.training.trainer import Trainer

    return Trainer(load_config([cfg_path])).train()


def test_a_finished_run_started_again_does_nothing_and_says_so(tmp_path, token_dataset, capsys):
    ck, run = str(tmp_path / "ck"), str(tmp_path / "run")
    path = write_yaml(tmp_path / "a.yml", train_config_dict(tmp_path, token_dataset, train_iters=4, save=ck,
                                                            load=ck, save_interval=4, run_dir=run))
    first = _run(path)
    assert first["iteration"] == 4 and "test" in first
    rows = read_metrics(metrics_path(run))
    capsys.readouterr()
    again = _run(path)
    out = capsys.readouterr().out
    assert again["exit_code"] == 0 and again.get("already_finished")
    assert "this run already finished" in out and "Raise train-iters" in out
    assert read_metrics(metrics_path(run)) == rows  # not one row more


def test_a_run_killed_before_its_final_evaluation_evaluates_when_started_again(tmp_path, token_dataset):
    ck, run = str(tmp_path / "ck"), str(tmp_path / "run")
    path = write_yaml(tmp_path / "a.yml", train_config_dict(tmp_path, token_dataset, train_iters=4, save=ck,
                                                            load=ck, save_interval=4, run_dir=run))
    _run(path)
    mpath = metrics_path(run)
    kept = [line for line in open(mpath) if '"kind": "test"' not in line]  # as if it died before the test row
    with open(mpath, "w") as f:
        f.writelines(kept)
    again = _run(path)
    assert not again.get("already_finished") and "test" in again
    assert sum(r["kind"] == "test" for r in read_metrics(mpath)) == 1
    assert os.path.isfile(os.path.join(ck, "latest"))
