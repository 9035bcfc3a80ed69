"""The tools never replace an output silently: merge_tp_checkpoint.py onto a run's checkpoint
directory, export_hf.py into an earlier export and evaluate.py into earlier results are refused
(exit 2, one message) unless --overwrite, which replaces the whole output; and two evaluations
into one --out cannot both write (the second is refused naming the first)."""
import os
import shutil
import subprocess
import sys

import pytest

from megatron.checkpoint.tags import read_latest
from megatron.checkpoint.writer import holds_optimizer_state
from tests.conftest import ROOT, write_yaml
from tests.integration.fault_helpers import child_env, train_checkpoint


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(config dict, checkpoint dir: global_step2, global_step4 (with optimizer state), latest -> 4)."""
    return train_checkpoint(tmp_path_factory.mktemp("outputs"))


@pytest.fixture
def ck(trained):
    return trained[1]


def cli(script, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, script), *map(str, args)], capture_output=True,
                          text=True, cwd=ROOT, env=child_env(), timeout=300)


def refused(proc, *words):
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for w in words:
        assert w in proc.stderr, proc.stderr[-3000:]


def test_merge_onto_a_runs_checkpoints_is_refused_unless_overwrite(ck, tmp_path):
    run = str(tmp_path / "run_ck")
    shutil.copytree(ck, run)
    merge = ("tools/merge_tp_checkpoint.py", "--input", ck, "--output", run, "--iteration", 2)
    refused(cli(*merge), f"--output {run} already exists", "global_step2, global_step4", "--overwrite")
    assert read_latest(run) == "global_step4" and holds_optimizer_state(os.path.join(run, "global_step2"))
    assert cli(*merge, "--overwrite").returncode == 0
    assert sorted(os.listdir(run)) == ["global_step2", "latest"] and read_latest(run) == "global_step2"
    assert not holds_optimizer_state(os.path.join(run, "global_step2"))  # the merged weights, whole
    assert [n for n in os.listdir(tmp_path) if ".tmp" in n or ".old" in n] == []
    # an --output that holds the input is refused even with --overwrite (it would delete its source)
    refused(cli("tools/merge_tp_checkpoint.py", "--input", run, "--output", tmp_path, "--overwrite"),
            "holds the checkpoint being read")


def test_export_into_an_earlier_export_is_refused_unless_overwrite(ck, tmp_path):
    out = tmp_path / "hf"
    assert cli("tools/export_hf.py", "--checkpoint", ck, "--out", out).returncode == 0
    (out / "vocab.json").write_text("{}")  # an earlier export's tokenizer file
    refused(cli("tools/export_hf.py", "--checkpoint", ck, "--out", out, "--iteration", 2),
            f"--out {out} already exists", "--overwrite")
    proc = cli("tools/export_hf.py", "--checkpoint", ck, "--out", out, "--iteration", 2, "--overwrite")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "model.safetensors").is_file() and not (out / "vocab.json").exists()  # replaced whole
    assert sorted(os.listdir(tmp_path)) == ["hf"]


def test_evaluate_keeps_earlier_results_and_one_evaluation_per_out(ck, tmp_path):
    from megatron.process.run_lock import RunLock

    out = tmp_path / "eval"
    sweep = ("evaluate.py", "--checkpoint", ck, "--lengths", 32, "--max-windows", 2, "--out", out, "--quiet")
    assert cli(*sweep).returncode == 0
    first = (out / "eval.json").read_text()
    refused(cli(*sweep, "--window", 8), "already holds the results of an earlier evaluation (eval.json, eval.csv",
            "--overwrite")
    assert (out / "eval.json").read_text() == first
    with RunLock(str(out), path=str(out / "eval.lock")):  # an evaluation writing there right now
        refused(cli(*sweep, "--overwrite"), "is in use by another evaluation", f"pid {os.getpid()}")
    proc = cli(*sweep, "--window", 8, "--overwrite")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "eval.json").read_text() != first
    assert not (out / "eval.lock").exists()  # released with the run: results folders hold results


def test_eval_py_keeps_an_earlier_harness_json(trained, tmp_path):
    """deepy.py eval.py (NeoX's entry point) writes <load>/../eval/harness.json: kept unless --overwrite."""
    conf, ck = trained
    earlier = os.path.join(os.path.dirname(ck), "eval", "harness.json")
    os.makedirs(os.path.dirname(earlier), exist_ok=True)
    with open(earlier, "w") as f:
        f.write("{}")
    config = write_yaml(tmp_path / "eval.yml", {**conf, "load": ck, "run-dir": str(tmp_path / "run")})
    try:
        refused(cli("deepy.py", "eval.py", config, "--eval_tasks", "kerple_local"),
                "already holds the results of an earlier evaluation (harness.json)", "--overwrite")
        assert open(earlier).read() == "{}"
    finally:
        os.remove(earlier)
