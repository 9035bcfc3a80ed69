"""Trivial CLI mistakes (an unknown flag, a missing checkpoint or config file) are answered before
the heavy imports: torch alone takes ~1 s warm and 8-13 s from a cold disk cache, deepspeed and
lm_eval more. Each case runs the entry point in a child process that reports afterwards which heavy
modules were imported; the message and exit status are those of megatron.errors.run_cli."""
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT
from tests.integration.fault_helpers import child_env

HEAVY = ("torch", "deepspeed", "lm_eval", "transformers")
# Runs the script as __main__ (as `python SCRIPT ...` does), then prints the heavy modules it imported.
PROBE = """
import runpy, sys
sys.path.insert(0, {root!r})
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as e:
    code = e.code
print("HEAVY=" + ",".join(m for m in {heavy!r} if m in sys.modules), file=sys.stderr)
sys.exit(code)
"""

CASES = [
    ("evaluate.py", ["--checkpoint", "CK", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ("evaluate.py", ["--checkpoint", "MISSING"], "does not exist"),
    ("evaluate.py", ["--checkpoint", "MISSING", "--tasks", "kerple_local"], "does not exist"),
    ("eval.py", ["--no-such-flag", "--eval_tasks", "x"], "unrecognized arguments: --no-such-flag"),
    ("generate.py", ["--checkpoint", "MISSING", "--prompt", "x"], "does not exist"),
    ("train.py", ["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ("train.py", ["configs/quickstart.yaml"], "config file not found"),
    ("deepy.py", ["train.py", "configs/quickstart.yaml"], "config file not found"),
    ("deepy.py", ["--no-such-flag", "train.py", "configs/quickstart.yml"], "unrecognized arguments"),
    ("deepy.py", ["trian.py", "configs/quickstart.yml"], "script 'trian.py' not found (expected e.g. train.py or "
                                                         "eval.py); did you mean train.py?"),
    ("deepy.py", ["train.py", "configs/quickstart.yaml"], "did you mean configs/quickstart.yml?"),
    ("tools/export_hf.py", ["--checkpoint", "MISSING", "--out", "OUT"], "does not exist"),
    ("tools/merge_tp_checkpoint.py", ["--input", "MISSING", "--output", "OUT"], "does not exist"),
    ("tools/convert_neox_checkpoint.py", ["--input", "MISSING", "--output", "OUT", "--no-such-flag"],
     "unrecognized arguments"),
    ("tools/run_matrix.py", ["matrix.json", "--no-such-flag"], "unrecognized arguments"),
]


@pytest.mark.parametrize("script,argv,message", CASES, ids=[f"{s} {' '.join(a)}" for s, a, _ in CASES])
def test_cli_mistakes_are_answered_before_heavy_imports(tmp_path, script, argv, message):
    argv = [str(tmp_path / "missing") if a == "MISSING" else str(tmp_path / "out") if a == "OUT"
            else str(tmp_path) if a == "CK" else a for a in argv]
    env = child_env()
    env.pop("KERPLE_DEBUG", None)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", PROBE.format(root=ROOT, heavy=HEAVY), os.path.join(ROOT, script),
                           *argv], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    seconds = time.perf_counter() - start
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and message in proc.stderr, proc.stderr[-2000:]
    heavy = proc.stderr.rsplit("HEAVY=", 1)[1].strip()
    assert heavy == "", f"{script} imported {heavy} before reporting: {proc.stderr[-500:]}"
    assert seconds < 4, f"{script} took {seconds:.1f} s to report a trivial mistake"  # generous: ~0.2 s here
