"""tools/extrapolation_study.py end to end at toy size: it builds the retrieval corpus where there is
none, trains a scheme on it through deepy.py, runs the kv grid, reads the same model with window
attention, and writes the side-by-side table (the GPU check's `retrieval` step runs it at size)."""
import os
import subprocess
import sys

from tests.conftest import ROOT
from tests.integration.fault_helpers import child_env


def test_tiny_study_trains_evaluates_and_compares(tmp_path):
    data, out, table = tmp_path / "data", tmp_path / "study", tmp_path / "retrieval.md"
    # a corpus slice instead of the whole: the tool only builds one when it finds none
    subprocess.run([sys.executable, "tools/prepare_data.py", "retrieval", "--data-dir", str(data), "--max-files", "60",
                    "--vocab-size", "1024"], cwd=ROOT, env=child_env(), check=True, capture_output=True)
    proc = subprocess.run([sys.executable, "tools/extrapolation_study.py", "--out", str(out), "--tiny", "--schemes",
                           "kerple_log", "--batch", "2", "--data-dir", str(data), "--device", "cpu", "--table", str(table)],
                          cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    text = table.read_text()
    assert text == (out / "compare" / "compare.md").read_text()
    retrieval = text.split("## Retrieval: kv")[1]
    header = retrieval.split("\n| length |")[1].splitlines()[0]
    assert "kerple_log (kerple_log)" in header and "window128 (kerple_log (window 128))" in header, retrieval
    assert "| 128 |" in retrieval and "| 256 |" in retrieval and "| effective length |" in retrieval
    assert os.path.isfile(out / "kerple_log" / "eval" / "retrieval_kv.jsonl")


def test_tiny_recipes_study_trains_each_recipe(tmp_path):
    """Issue 56's study: one scheme with randomized positions and with PoSE, compared (no plain run: no window)."""
    data, out = tmp_path / "data", tmp_path / "study"
    subprocess.run([sys.executable, "tools/prepare_data.py", "retrieval", "--data-dir", str(data), "--max-files", "60",
                    "--vocab-size", "1024"], cwd=ROOT, env=child_env(), check=True, capture_output=True)
    proc = subprocess.run([sys.executable, "tools/extrapolation_study.py", "--out", str(out), "--tiny", "--schemes",
                           "kerple_log", "--recipes", "randomized", "pose", "--backend", "sdpa", "--batch", "2",
                           "--data-dir", str(data), "--device", "cpu"],
                          cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    header = next(line for line in (out / "compare" / "compare.md").read_text().splitlines() if line.startswith("| length"))
    assert "kerple_log_randomized" in header and "kerple_log_pose" in header, header
    resolved = (out / "kerple_log_pose" / "resolved_config.yml").read_text()
    assert "pos-skip-target-length: 256" in resolved or "pos_skip_target_length: 256" in resolved, resolved


def test_a_missing_corpus_directory_that_cannot_be_built_is_one_line(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    proc = subprocess.run([sys.executable, "tools/extrapolation_study.py", "--out", str(tmp_path / "o"), "--tiny",
                           "--data-dir", str(blocked)], cwd=ROOT, env=child_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
