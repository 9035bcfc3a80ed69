"""The stop handler: the first Ctrl-C asks for a save at the step boundary, a second one exits at
once with status 130 and one line, no traceback; pre-emption signals (SIGHUP too) keep exit status 0."""
import os
import signal
import subprocess
import sys
import textwrap

from megatron.process.stop_signals import PreemptionHandler
from tests.conftest import ROOT

TWICE = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {root!r})
    from megatron.process.stop_signals import PreemptionHandler
    h = PreemptionHandler().install()
    os.kill(os.getpid(), signal.SIGINT)
    assert h.requested() and h.exit_code == 130
    print("first Ctrl-C: still running", flush=True)
    os.kill(os.getpid(), signal.SIGINT)
    print("not reached", flush=True)
""")


def test_second_ctrl_c_exits_at_once_with_130():
    proc = subprocess.run([sys.executable, "-c", TWICE.format(root=ROOT)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 130, proc.stderr
    assert "first Ctrl-C: still running" in proc.stdout and "not reached" not in proc.stdout
    assert "Traceback" not in proc.stderr
    assert [line for line in proc.stderr.splitlines() if "second Ctrl-C" in line]


def test_preemption_signals_exit_0():
    """SIGTERM, and SIGHUP (a terminal that went away, or `kill -HUP`, passed on by deepy.py)."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        h = PreemptionHandler().install()
        try:
            assert not h.requested()
            os.kill(os.getpid(), sig)
            assert h.requested() and h.received == sig and h.exit_code == 0
        finally:
            h.uninstall()
