"""What a run prints, from several processes and through third-party libraries: one home for
(1) the "[rank N] " prefix on the lines of every rank but 0, so that two workers' lines can be told
apart, and (2) the third-party lines that say nothing to a user of this stack, dropped where they
are made.

Dropped, each because our own output already says it:
- DeepSpeed's "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to
  detect it." (a WARNING at its import on every machine without CUDA): every entry point prints
  its device (`device cpu (2 threads)`), chosen by megatron/device.py.
- DeepSpeed's "DeepSpeed ... deepspeed_shm_comm_op built successfully", printed at every process
  group start even when the op comes from the cache: init_distributed says once, with the time,
  when the op was really compiled (`quiet_op_load`, megatron/process/op_cache.py).
- torch's FutureWarning "`torch.distributed.all_gather_into_tensor` is deprecated" (and the same
  for its other collectives), raised inside DeepSpeed's ZeRO code by every rank at every save:
  nothing a user of this stack can change.
- The runner's "Unable to find hostfile, will proceed with training with local resources only."
  when no hostfile was configured (a run on this machine is what was asked for).
- The runner's INFO lines (its command, world info, "process N spawned", "exits successfully"):
  deepy.py prints the command it runs, and the runner's warnings and errors still show
  (launcher.runner_args passes `--log_level warning`).
`--debug` (KERPLE_DEBUG=1) keeps all of them.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
import time
import warnings

DEEPSPEED_LOGGER = "DeepSpeed"
_DROPPED_LOG_MESSAGES = [re.compile(r"^Setting accelerator to CPU\. If you have GPU")]
_DROPPED_OP_LINE = re.compile(r"^DeepSpeed \S+ built successfully$")
_keep_all = False  # --debug: nothing is dropped (set by run_cli through quiet_third_party)


class _DropKnownNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if _keep_all:  # --debug: everything, as the library says it
            return True
        message = record.getMessage()
        return not any(p.search(message) for p in _DROPPED_LOG_MESSAGES)


def quiet_third_party(keep_all: bool | None = None) -> None:
    """Install the filters before DeepSpeed is imported (its import logs the CPU warning).
    logging.getLogger returns the logger DeepSpeed configures later, and a filter set on it stays.
    keep_all (run_cli passes --debug's state): drop nothing."""
    global _keep_all
    if keep_all is not None:
        _keep_all = keep_all
    if not _keep_all:
        warnings.filterwarnings("ignore", message=r"`torch\.distributed\.\w+` is deprecated", category=FutureWarning)
    logger = logging.getLogger(DEEPSPEED_LOGGER)
    if not any(isinstance(f, _DropKnownNoise) for f in logger.filters):
        logger.addFilter(_DropKnownNoise())


def drop_log_message(message: str) -> None:
    """Drop one more exact DeepSpeed log message from now on (a launcher's, when our own line says it)."""
    quiet_third_party()
    _DROPPED_LOG_MESSAGES.append(re.compile("^" + re.escape(message) + "$"))


class _LineFilter(io.TextIOBase):
    """A text stream that passes whole lines to `target`, transformed by `edit` (None drops the line)."""

    def __init__(self, target, edit):
        self.target, self.edit, self.pending = target, edit, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            edited = self.edit(line)
            if edited is not None:
                self.target.write(edited + "\n")
        return len(text)

    def flush(self) -> None:
        if self.pending:  # a partial line is written as it is (a prompt, a progress dot)
            edited = self.edit(self.pending)
            self.pending = ""
            if edited is not None:
                self.target.write(edited)
        self.target.flush()

    def isatty(self) -> bool:
        return self.target.isatty()

    def fileno(self) -> int:
        return self.target.fileno()

    @property
    def encoding(self):
        return getattr(self.target, "encoding", "utf-8")


def rank_of_worker() -> int | None:
    """This process's global rank when a launcher started several (RANK, WORLD_SIZE), else None."""
    try:
        world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    except ValueError:
        return None
    return rank if world > 1 else None


def prefix_rank_output() -> None:
    """Every line a worker of rank > 0 prints gets "[rank N] " in front: rank 0 speaks for the run
    (its lines stay as they are), and what another rank says is told apart. Output written below
    Python (C++ warnings from gloo) is not prefixed."""
    rank = rank_of_worker()
    if not rank or isinstance(sys.stdout, _LineFilter):
        return
    sys.stdout = _LineFilter(sys.stdout, lambda line: f"[rank {rank}] {line}" if line else line)
    sys.stderr = _LineFilter(sys.stderr, lambda line: f"[rank {rank}] {line}" if line else line)


@contextlib.contextmanager
def drop_op_built_line():
    """Drop DeepSpeed's "op built successfully" line printed inside the block (--debug keeps it);
    megatron/process/op_cache.py's `quiet_op_load` says instead when the op was really compiled."""
    saved = sys.stdout
    drop = not _keep_all
    sys.stdout = _LineFilter(saved, lambda line: None if drop and _DROPPED_OP_LINE.match(line.strip()) else line)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stdout = saved


def say(message: str, file=None) -> None:
    """print() for a line about the whole run, which every rank would say alike ("no checkpoint in
    ...", "loaded ..."): rank 0 says it for all."""
    if not rank_of_worker():
        print(message, file=file or sys.stdout, flush=True)


def seconds_since_start() -> float:
    """Wall-clock seconds since this process started (imports included): the "ready after" a
    run's first lines report, the setup phase's one timing."""
    import psutil  # lazy: a DeepSpeed requirement (~30 ms); every entry point imports this module

    return max(0.0, time.time() - psutil.Process().create_time())
