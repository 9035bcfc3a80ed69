"""Liveness of the processes of a multi-process run, and the launcher's channel to them.

Why: on several hosts, a host that crashes or drops off the network leaves the others waiting in a
collective: gloo waits for its timeout (30 minutes by default), and a cut link raises nothing at
all. So every rank runs a heartbeat thread on a client connection of its own to the run's
rendezvous store (the TCPStore torch.distributed already serves from rank 0 at MASTER_ADDR:
MASTER_PORT; the connection has its own timeout, `lost-host-timeout`):

- every rank beats (a counter per rank) every `interval` seconds;
- rank 0 reads every rank's counter: one that has not moved for `lost-host-timeout` seconds has
  lost its host; after a collective failed in rank 0 (gloo saw a connection close), a rank that
  missed STALE_BEATS beats is lost at once, since a dead process stops beating while the living
  keep on;
- the first rank to know why the run cannot go on (rank 0 for a lost rank; any rank that fails
  with an error) publishes a verdict in the store, prints it (rank 0, or the failing rank's own
  error message) and exits; every other rank reads the verdict at its next beat and exits quietly,
  even from the middle of a collective that would otherwise wait;
- a rank whose store does not answer (rank 0's process or host is gone) exits with its own line.

A verdict line starts with VERDICT_MARK: deepy.py passes it through as the run's last word
(megatron/launch/output.py) and drops the launcher's per-host exit lines that said less.

The same store carries the launcher's signals (post_signal): deepy.py, signalled, posts the signal
and each rank's heartbeat delivers it to its own process, whose handler saves at the step boundary
(megatron/process/stop_signals.py), on every host, as the local launcher's direct signal does on one.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import signal
import socket
import sys
import threading
import time

from megatron.errors import add_failure_hook, debug_enabled

EXIT_LOST_HOST = 75  # EX_TEMPFAIL: nothing is wrong with the run itself; run it again to resume
STALE_BEATS = 5  # beats a rank may miss after a collective failed before it counts as gone
VERDICT_MARK = "[run stopped]"
KILL_NOW = 9  # posted as a "signal": the launcher gave up waiting; every rank exits at once
_PREFIX = "kerple/"


def beat_interval(timeout_s: float) -> float:
    """A beat per 1/12 of the timeout, between 0.2 s and 1 s: a signal posted by the launcher
    arrives within a beat, and a few store calls per rank per second are nothing to the store
    (rank 0 reads one key per rank)."""
    return min(max(timeout_s / 12, 0.2), 1.0)


def _client(addr: str, port: int, timeout_s: float):
    from torch.distributed import TCPStore  # lazy: torch; deepy.py's supervisor and run_matrix.py import this module

    return TCPStore(addr, port, is_master=False, wait_for_workers=False,
                    timeout=datetime.timedelta(seconds=timeout_s))


def _say(text: str) -> None:
    with contextlib.suppress(OSError):
        sys.stdout.flush()
        os.write(sys.stderr.fileno(), (text + "\n").encode())


class Heartbeat:
    """One per process of a multi-process run (started by init_distributed)."""

    def __init__(self, rank: int, world_size: int, addr: str, port: int, timeout_s: float,
                 describe_stop=None):
        self.rank, self.world, self.timeout_s = rank, world_size, timeout_s
        self.interval = beat_interval(timeout_s)
        self.describe_stop = describe_stop  # () -> str: what `latest` holds and how to resume
        self.store = _client(addr, port, timeout_s)
        self.store.set(f"{_PREFIX}host/{rank}", socket.gethostname())
        self.collective_failed_at: float | None = None
        self._published = False  # this rank's own verdict: its thread does not follow it
        self._signals_seen = 0
        self._stop = threading.Event()
        self._last_ok = time.monotonic()  # the end of the last beat whose store calls all answered
        self._thread = threading.Thread(target=self._loop, name="kerple-heartbeat", daemon=True)
        self._guard = threading.Thread(target=self._watch_store, name="kerple-heartbeat-guard", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        self._guard.start()
        return self

    def _watch_store(self) -> None:
        """A store call to a host that dropped off the network does not fail: TCP retransmits for
        a quarter of an hour, the store client's timeout notwithstanding (seen on a cut link). So
        this second thread ends the process when the beats have not got through for the timeout."""
        while not self._stop.wait(self.interval):
            silent = time.monotonic() - self._last_ok
            if silent > self.timeout_s + self.interval:
                self._exit(f"the rendezvous store on rank 0's host ({os.environ.get('MASTER_ADDR', '?')}:"
                           f"{os.environ.get('MASTER_PORT', '?')}) has not answered for {silent:.0f} s: rank 0's host "
                           "crashed or dropped off the network, or this host did", reachable=False)

    # ------------------------------------------------------------ the thread
    def _loop(self) -> None:
        last_value: dict[int, int] = {}
        last_change: dict[int, float] = {}
        while not self._stop.is_set():
            try:
                self._beat(last_value, last_change)
                self._last_ok = time.monotonic()
            except Exception as e:  # noqa: BLE001 - any store failure means the same: rank 0 is unreachable
                if self._stop.is_set():
                    return
                self._lost_rendezvous(e)
            self._stop.wait(self.interval)

    def _beat(self, last_value: dict, last_change: dict) -> None:
        s, now = self.store, time.monotonic()
        s.add(f"{_PREFIX}beat/{self.rank}", 1)
        if not self._published and s.check([f"{_PREFIX}verdict"]):
            self._follow_verdict()
        self._deliver_signals()
        watched = range(self.world) if self.rank == 0 else [0]
        for r in watched:
            value = s.add(f"{_PREFIX}beat/{r}", 0)
            if last_value.get(r) != value:
                last_value[r], last_change[r] = value, now
        if self.rank == 0:
            self._judge(last_change, now)
        elif now - last_change[0] > self.timeout_s:  # rank 0's store answers, its beat stopped (a hung process)
            self._exit(f"rank 0 on {self._host(0)} stopped beating for {now - last_change[0]:.0f} s")

    def _judge(self, last_change: dict, now: float) -> None:
        """Rank 0: which ranks are lost, if any; then the verdict."""
        failed = self.collective_failed_at is not None
        limit = STALE_BEATS * self.interval if failed else self.timeout_s
        lost = [r for r in range(1, self.world) if now - last_change.get(r, now) > limit]
        if not lost:
            return
        hosts = sorted({self._host(r) for r in lost})
        silent = max(now - last_change[r] for r in lost)
        why = ("its processes ended, or it crashed" if failed else "it crashed or dropped off the network")
        self.publish(f"lost host {', '.join(hosts)} (rank{'s' if len(lost) > 1 else ''} "
                     f"{', '.join(map(str, lost))}: no heartbeat for {silent:.0f} s: {why})", announce=True)

    def _deliver_signals(self) -> None:
        count = self.store.add(f"{_PREFIX}signals", 0)
        while self._signals_seen < count:
            self._signals_seen += 1
            signum = int(self.store.get(f"{_PREFIX}signal/{self._signals_seen}"))
            if signum == KILL_NOW:
                _say(f"[signal] the launcher gave up waiting: rank {self.rank} exits now")
                os._exit(128 + signal.SIGKILL)
            from megatron.process.stop_signals import deliver  # lazy: pulls in torch (see _client)

            deliver(signum)  # to the trainer's own handler, as a local signal would go

    def _host(self, rank: int) -> str:
        with contextlib.suppress(Exception):
            if self.store.check([f"{_PREFIX}host/{rank}"]):
                return self.store.get(f"{_PREFIX}host/{rank}").decode()
        return f"(host of rank {rank} unknown)"

    # ------------------------------------------------------------ ending
    def publish(self, verdict: str, announce: bool) -> None:
        """Make `verdict` the run's (unless another rank's came first); with `announce`, say it
        and exit (else the caller goes on to its own exit)."""
        self._published = True
        with contextlib.suppress(Exception):
            verdict = self.store.compare_set(f"{_PREFIX}verdict", "", verdict).decode()
        if announce:
            self._exit(verdict)

    def _follow_verdict(self) -> None:
        """Another rank decided: leave quietly (its line says why)."""
        self._leave()
        os._exit(EXIT_LOST_HOST)

    def _leave(self) -> None:
        """Count this rank out. Rank 0 serves the store: it waits (bounded) until the others have
        read the verdict or stopped, so none of them takes the store's end for a lost host."""
        with contextlib.suppress(Exception):
            self.store.add(f"{_PREFIX}stopped", 1)
            if self.rank == 0:
                deadline = time.monotonic() + 3 * self.interval
                while self.store.add(f"{_PREFIX}stopped", 0) < self.world and time.monotonic() < deadline:
                    time.sleep(0.05)

    def _lost_rendezvous(self, error: Exception) -> None:
        first = " ".join(str(error).split())[:160]
        self._exit(f"lost contact with the rendezvous store on rank 0's host "
                   f"({os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}: {first}): "
                   "rank 0's host crashed or dropped off the network, or this host did", reachable=False)

    def _exit(self, what: str, reachable: bool = True) -> None:
        tail = ""
        if self.describe_stop is not None:
            with contextlib.suppress(Exception):
                tail = "; " + self.describe_stop()
        _say(f"{VERDICT_MARK} {what}{tail}")
        if reachable:  # else every store call would wait out its timeout
            self._leave()
        os._exit(EXIT_LOST_HOST)

    def after_failure(self, error: BaseException) -> None:
        """Called on the way out of an entry point that failed. A failed collective (a peer's
        connection closed or timed out) waits here for the verdict (the thread exits the
        process), bounded by the timeout; any other failure is this rank's own: it becomes the
        verdict, so the others stop at once instead of waiting in their next collective."""
        if _is_collective_failure(error):
            self.collective_failed_at = time.monotonic()
            self._stop.wait(self.timeout_s + 2 * self.interval)
            return  # nobody was lost: the error is reported as it is
        self.publish(f"rank {self.rank} on {socket.gethostname()} failed (its message is above)", announce=False)
        self._stop.set()
        self._leave()

    def stop(self) -> None:
        """At a normal end: no more beats. Rank 0 serves the store until every rank has stopped
        (bounded by the timeout: the others may still be finishing their last step's work)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=self.interval + 1)
        with contextlib.suppress(Exception):
            self.store.add(f"{_PREFIX}stopped", 1)
            if self.rank == 0:
                deadline = time.monotonic() + self.timeout_s
                while self.store.add(f"{_PREFIX}stopped", 0) < self.world and time.monotonic() < deadline:
                    time.sleep(0.05)


def _is_collective_failure(error: BaseException) -> bool:
    """gloo/nccl's errors when a peer's connection closes or a collective times out."""
    import torch.distributed as dist  # lazy: torch (see _client)

    if isinstance(error, getattr(dist, "DistError", ())):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(
        s in text for s in ("Connection reset by peer", "Connection closed by peer", "Socket Timeout", "[gloo", "NCCL"))


_active: Heartbeat | None = None


def start_heartbeat(rank: int, world_size: int, timeout_s: float, describe_stop=None) -> Heartbeat | None:
    """The process's heartbeat (one per process; None for one process)."""
    global _active
    if world_size <= 1:
        return None
    if _active is None:
        _active = Heartbeat(rank, world_size, os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                            timeout_s, describe_stop).start()

        add_failure_hook(_active.after_failure)
    return _active


def stop_heartbeat() -> None:
    global _active
    if _active is not None:
        _active.stop()
        _active = None


@contextlib.contextmanager
def _without_cpp_warnings():
    """c10d's C++ warning on connecting from a host without reverse DNS for its own address ("The
    hostname of the client socket cannot be retrieved") would be deepy.py's only line after the
    signal's; torch reads its log level once at import, so stderr is closed for the connect (a few
    ms) instead, unless --debug."""
    if debug_enabled():
        yield
        return
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def post_signal(addr: str, port: int, signum: int, timeout_s: float = 5.0) -> bool:
    """The launcher's side: post `signum` for every rank's heartbeat to deliver. False when the
    store cannot be reached (the workers have not started it yet, or it is gone)."""
    try:
        with _without_cpp_warnings():
            store = _client(addr, port, timeout_s)
        n = store.add(f"{_PREFIX}signal_slots", 1)
        store.set(f"{_PREFIX}signal/{n}", str(signum))
        store.add(f"{_PREFIX}signals", 1)
        return True
    except Exception:  # noqa: BLE001 - unreachable, for whatever reason: the caller falls back
        return False
