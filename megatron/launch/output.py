"""What a remote launcher (pdsh, srun, mpirun) brings back to deepy.py's terminal.

On one host the workers' noise is dropped where it is made (megatron/console.py), but a remote
launcher runs DeepSpeed's per-node launcher on every host with its INFO logging on, and c10d's
C++ warnings have no Python filter. So deepy.py reads the remote launcher's output line by line
and drops, unless --debug:
- DeepSpeed's per-node launcher INFO lines (world info, "process N spawned", "exits successfully")
  and its "Setting accelerator to CPU" warning: deepy.py prints the command it runs and every rank
  prints its device;
- c10d's "hostname of the client socket cannot be retrieved" (a host without reverse DNS for its
  peers: nothing wrong) and the C++ stack a TCPStore warning drags along ("Exception raised
  from", "frame #N"), which the heartbeat's own line replaces.
It also holds back two kinds of line to word the run's end itself:
- the heartbeat's verdict (megatron/process/heartbeat.py VERDICT_MARK): the host that was lost,
  what `latest` holds and how to resume; deepy.py prints it last, once, in its own voice;
- pdsh's "pdsh@h1: h2: ssh exited with exit code N" and the per-node launcher's "... exits with
  return code = N": shown at the end when there is no verdict (they say which host failed),
  dropped when there is one (they say less than it does).
"""
from __future__ import annotations

import re
import sys
import threading

from megatron.process.heartbeat import VERDICT_MARK

_HOST = r"^(?:\S+: )?"  # pdsh's "host: " prefix
_DROPPED = [
    re.compile(_HOST + r"\[[\d\- :,]+\] \[INFO\] \[launch\.py:\d+:\w+\]"),
    re.compile(_HOST + r"\[[\d\- :,]+\] \[WARNING\] \[real_accelerator\.py:\d+:get_accelerator\] Setting accelerator"),
    re.compile(_HOST + r"\[W\d{4} [\d:.]+ \S+\] \[c10d\] The hostname of the client socket cannot be retrieved"),
    re.compile(_HOST + r"\[W\d{4} [\d:.]+ \S*TCPStore\.cpp:\d+\] \[c10d\]"),
    re.compile(_HOST + r"(Exception raised from \S+ at \S+|frame #\d+: |<omitting python frames>)"),
]
_LAUNCHER_EXIT = re.compile(r"^pdsh@\S+: \S+: ssh exited with exit code \d+$|"
                            + _HOST + r"\[[\d\- :,]+\] \[ERROR\] \[launch\.py:\d+:sigkill_handler\] .* exits with return code")


class OutputRelay:
    """Copies a launcher's output to our stdout, filtered; `verdict` and `held` after `join()`."""

    def __init__(self, stream, keep_all: bool, out=None):
        self.stream, self.keep_all, self.out = stream, keep_all, out or sys.stdout
        self.verdict: str | None = None
        self.held: list[str] = []
        self._thread = threading.Thread(target=self._copy, name="launcher-output", daemon=True)

    def start(self) -> OutputRelay:
        self._thread.start()
        return self

    def _copy(self) -> None:
        for line in iter(self.stream.readline, ""):
            kept = self.filter(line.rstrip("\n"))
            if kept is not None:
                self.out.write(kept + "\n")
                self.out.flush()

    def filter(self, line: str) -> str | None:
        """The line to print now, or None (dropped, or held for the end)."""
        if VERDICT_MARK in line:
            if self.verdict is None:
                self.verdict = line[line.index(VERDICT_MARK) + len(VERDICT_MARK):].strip()
            return line if self.keep_all else None
        if self.keep_all:
            return line
        if _LAUNCHER_EXIT.match(line):
            self.held.append(line)
            return None
        return None if any(p.search(line) for p in _DROPPED) else line

    def join(self, timeout: float = 10) -> None:
        self._thread.join(timeout)

    def last_words(self) -> list[str]:
        """The lines that end the run's output."""
        if self.verdict:
            return [f"deepy.py: the run stopped: {self.verdict}"]
        return self.held
