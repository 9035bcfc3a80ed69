"""Slurm pre-emption's requeue decision (tools/slurm/supervise.sh with deepy.py's stop outcome,
megatron/launch/signals.py): a run that a USR1 stopped before its end is requeued; one that
had reached its last step when the signal came is not (its next start would have nothing to do);
a failed run is not requeued. No Slurm needed: `scontrol` is a stand-in that records its arguments."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import pytest

from megatron.launch.signals import STOP_OUTCOME_ENV, StopReport
from tests.conftest import ROOT

# Stands in for deepy.py: on USR1 it writes the given outcome where deepy.py would, and exits 0.
CHILD = textwrap.dedent("""
    import os, signal, sys, time
    def stop(signum, frame):
        if sys.argv[1] != "-":
            open(os.environ["KERPLE_STOP_OUTCOME"], "w").write(sys.argv[1] + "\\n")
        sys.exit(int(sys.argv[2]))
    signal.signal(signal.SIGUSR1, stop)
    print("child ready", flush=True)
    while True:
        time.sleep(0.05)
""")


def preempt(tmp_path, outcome: str, status: int = 0) -> tuple[str, str]:
    """(batch script's output, scontrol's recorded calls) after one USR1 to the batch shell."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol_calls"
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bin_dir / "scontrol").chmod(0o755)
    script = f"source tools/slurm/supervise.sh; run_supervised {sys.executable} -c '{CHILD}' {outcome} {status}"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_ID="77", TMPDIR=str(tmp_path))
    proc = subprocess.Popen(["bash", "-c", script], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    assert proc.stdout.readline().strip() == "child ready"
    time.sleep(0.2)  # the shell is in `wait` with its traps in place
    proc.send_signal(signal.SIGUSR1)
    out = proc.stdout.read()
    proc.wait(timeout=30)
    assert not list(tmp_path.glob("kerple-outcome-*")), "the outcome file is removed"
    return out, calls.read_text() if calls.exists() else ""


def test_a_run_stopped_before_its_end_is_requeued(tmp_path):
    out, calls = preempt(tmp_path, "resume")
    assert "requeueing job 77" in out and calls == "requeue 77\n", out


def test_a_run_that_had_finished_is_not_requeued(tmp_path):
    out, calls = preempt(tmp_path, "finished")
    assert "had finished before the signal took effect: not requeueing job 77" in out, out
    assert calls == ""


def test_a_tool_that_writes_no_outcome_is_requeued_as_before(tmp_path):
    out, calls = preempt(tmp_path, "-")  # run_matrix.py: its children do not write the file
    assert calls == "requeue 77\n", out


def test_a_failed_run_is_not_requeued(tmp_path):
    out, calls = preempt(tmp_path, "resume", status=1)
    assert calls == "", out


def run_cfg(tmp_path, train_iters=10):
    ck = tmp_path / "checkpoints"
    return SimpleNamespace(
        checkpoint=SimpleNamespace(load=str(ck), save=str(ck), finetune=False),
        logging=SimpleNamespace(run_dir=str(tmp_path)),
        training=SimpleNamespace(train_iters=train_iters, eval_iters=0),
        data=SimpleNamespace(single_path=None, test_data_paths=None),
        parallel=SimpleNamespace(),
    )


@pytest.mark.parametrize("saved_step, evaluated, outcome", [
    (10, True, "finished"),   # last step saved and its final evaluation written
    (10, False, "resume"),    # saved at the last step, killed before the final evaluation: it evaluates when started
    (6, True, "resume"),      # stopped before its end
])
def test_deepy_writes_the_stop_outcome(tmp_path, monkeypatch, saved_step, evaluated, outcome):
    cfg = run_cfg(tmp_path)
    ck = tmp_path / "checkpoints"
    (ck / f"global_step{saved_step}").mkdir(parents=True)
    (ck / "latest").write_text(f"global_step{saved_step}")
    if evaluated:
        (tmp_path / "metrics.jsonl").write_text(json.dumps({"kind": "validation", "iteration": saved_step,
                                                            "lm_loss": 1.0}) + "\n")
    out = tmp_path / "outcome"
    monkeypatch.setenv(STOP_OUTCOME_ENV, str(out))
    report = StopReport(cfg)
    report.record_outcome()
    assert out.read_text() == outcome + "\n"
    monkeypatch.delenv(STOP_OUTCOME_ENV)
    report.record_outcome()  # no file named: nothing written anywhere
    assert out.read_text() == outcome + "\n"
