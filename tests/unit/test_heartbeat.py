"""The heartbeat of a multi-process run (megatron/process/heartbeat.py), on two local processes (a
second each): a rank whose beats stop (SIGSTOP: what a host cut off the network looks like from
rank 0) is named as lost and every process ends; a signal posted by the launcher reaches every
rank's stop handler; a rank that fails with an error ends the other at once. The same on real
hosts: tests/cluster/test_pdsh.py."""
import os
import signal
import subprocess
import sys
import textwrap
import time

from megatron.process.distributed import free_port
from megatron.process.heartbeat import EXIT_LOST_HOST, VERDICT_MARK, post_signal
from tests.conftest import ROOT
from tests.integration.fault_helpers import child_env

TIMEOUT = 5.0  # short for the test; long enough that two busy cores do not delay a beat past it
RANK = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {root!r})
    from megatron.errors import UserError, run_cli
    from megatron.process import stop_signals as signals
    from megatron.process.distributed import init_distributed

    def main():
        signals.hold()
        init_distributed("cpu", "gloo", 1, {timeout}, lambda: "LATEST")
        handler = signals.PreemptionHandler().install()
        print("ready", flush=True)
        deadline = time.time() + 60
        while time.time() < deadline:
            if handler.received:
                print(f"rank {{os.environ['RANK']}} got signal {{handler.received}}", flush=True)
                return 0
            if os.environ["RANK"] == "1" and {fail!r} and os.path.exists({go!r}):
                raise UserError("rank 1's own error")
            time.sleep(0.05)
        return 1

    run_cli(main, "rank")
""")


def start_ranks(tmp_path, fail: bool = False) -> tuple[list[subprocess.Popen], int]:
    """Two ranks, once both are ready; with `fail`, rank 1 raises once the test creates tmp_path/go."""
    port = free_port()
    code = RANK.format(root=ROOT, timeout=TIMEOUT, fail=fail, go=str(tmp_path / "go"))
    procs = []
    for rank in (0, 1):
        env = {**child_env(), "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    for p in procs:
        line = p.stdout.readline()
        assert line.strip().endswith("ready"), line + p.stdout.read()  # rank 1: "[rank 1] ready"
    return procs, port


def finish(p, timeout=30) -> tuple[int, str]:
    out, _ = p.communicate(timeout=timeout)
    return p.returncode, out


def test_a_rank_that_stops_beating_is_named_and_every_process_ends(tmp_path):
    (r0, r1), _ = start_ranks(tmp_path)
    os.kill(r1.pid, signal.SIGSTOP)  # alive, connected, silent: a host cut off the network
    started = time.monotonic()
    try:
        rc, out = finish(r0)
        seconds = time.monotonic() - started
    finally:
        os.kill(r1.pid, signal.SIGCONT)
    assert rc == EXIT_LOST_HOST, out
    lines = [line for line in out.splitlines() if VERDICT_MARK in line]
    assert len(lines) == 1 and "lost host" in lines[0] and "(rank 1: no heartbeat for" in lines[0], out
    assert lines[0].endswith("; LATEST"), lines  # what `latest` holds, from the trainer
    assert TIMEOUT < seconds < TIMEOUT + 10, seconds
    rc1, out1 = finish(r1)  # woken up: rank 0 and its store are gone; it ends too, with its own line
    assert rc1 == EXIT_LOST_HOST, out1
    assert "Traceback" not in out + out1


def test_a_posted_signal_reaches_every_rank(tmp_path):
    (r0, r1), port = start_ranks(tmp_path)
    assert post_signal("127.0.0.1", port, signal.SIGUSR1)
    for rank, p in enumerate((r0, r1)):
        rc, out = finish(p)
        assert rc == 0 and f"rank {rank} got signal {int(signal.SIGUSR1)}" in out, out


def test_a_rank_that_fails_ends_the_others_at_once(tmp_path):
    (r0, r1), _ = start_ranks(tmp_path, fail=True)
    (tmp_path / "go").touch()
    started = time.monotonic()
    rc1, out1 = finish(r1)
    rc0, out0 = finish(r0)
    assert rc1 == 2 and "rank 1's own error" in out1, out1
    assert rc0 == EXIT_LOST_HOST and out0.strip() == "", out0  # quietly: rank 1's message says why
    assert time.monotonic() - started < TIMEOUT + 5


def test_post_signal_without_a_store_says_false():
    assert post_signal("127.0.0.1", free_port(), signal.SIGTERM, timeout_s=0.5) is False

