"""`make test` ends with one line per skip reason and its count (tests/conftest.py's
pytest_terminal_summary): a skip for a missing GPU reads apart from one for a missing dependency."""
import os
import subprocess
import sys

from tests.conftest import KERNEL_DEVICE, ROOT

SKIPPING = '''
import pytest

@pytest.mark.gpu
def test_on_cuda():
    pytest.skip("needs CUDA")

@pytest.mark.parametrize("i", range(3))
def test_needs_a_package(i):
    pytest.importorskip("no_such_package_here")

def test_plain():
    pytest.skip("not on this platform")

def test_runs():
    pass
'''


def test_the_summary_counts_each_skip_reason(tmp_path):
    (tmp_path / "test_skipping.py").write_text(SKIPPING)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
                           str(tmp_path / "test_skipping.py")],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, timeout=120)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "5 skipped, by reason" in out, out
    lines = [line.strip() for line in out.splitlines()]
    assert "3  could not import 'no_such_package_here': No module named 'no_such_package_here'" in lines, out
    assert "1  not on this platform" in lines, out
    if KERNEL_DEVICE.type != "cuda":  # on a GPU machine the skip keeps its own words
        assert "1  no GPU on this machine (`make test-gpu` runs it on one): needs CUDA" in lines, out
