"""tools/device_bundle.py: the lists of what the GPU image lacks stay true of this environment.
A pure-Python entry that grew a compiled extension would unpack on the device's Python 3.12 and
fail at import there, in the middle of scarce GPU time."""
import importlib.metadata as md
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
import device_bundle  # noqa: E402


@pytest.mark.parametrize("name", device_bundle.PURE)
def test_pure_entries_have_no_compiled_code(name):
    files = device_bundle.installed_files(name)
    assert files, f"{name}: no installed files"
    compiled = [f for f in files if f.endswith((".so", ".pyd"))]
    assert not compiled, f"{name} ships compiled code ({compiled[:3]}): move it to COMPILED"


@pytest.mark.parametrize("name", device_bundle.COMPILED)
def test_compiled_entries_are_installed(name):
    assert md.version(name)
