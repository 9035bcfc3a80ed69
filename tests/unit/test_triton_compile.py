"""The Triton kernels compile for real CUDA targets (H100 sm_90, A100 sm_80) without a GPU: the
interpreter that runs them in the other tests is more permissive than the compiler. Runs the tool
in a subprocess because this test process interprets the kernels (TRITON_INTERPRET=1)."""
import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "check_triton_compile.py")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_kernels_compile_for_cuda_targets():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, TOOL, "--quick"], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [line for line in res.stdout.splitlines() if line.startswith("| fwd") or line.startswith("| bwd")]
    assert len(rows) == 8 and all(row.rstrip().endswith("| yes |") for row in rows), res.stdout
    assert "sm_80" in res.stdout and "sm_90" in res.stdout


def test_tool_refuses_bad_input():
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, TOOL, "--quick"], capture_output=True, text=True, env=env)
    assert res.returncode == 2 and "TRITON_INTERPRET=1 is set" in res.stderr
    res = subprocess.run([sys.executable, TOOL, "--arch", "75"], capture_output=True, text=True)
    assert res.returncode == 2 and "known compute capabilities are 80" in res.stderr
