"""Expected failures and the one top-level handler every entry point uses.

An expected failure is one a user causes and can fix: a bad config, a missing or corrupt data
file or checkpoint, a full disk, a length that does not fit in memory. It ends in ONE message that
names the file/key and the fix, and a non-zero exit; the traceback is shown only when asked for
(`--debug` on any entry point, or KERPLE_DEBUG=1). Anything else is a bug in this stack and keeps
its traceback.

    from megatron.errors import run_cli
    if __name__ == "__main__":
        run_cli(main, "evaluate.py")
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sys
import traceback

from megatron.console import prefix_rank_output, quiet_third_party

DEBUG_ENV = "KERPLE_DEBUG"
DEBUG_FLAG = "--debug"
DEBUG_HINT = f"(run with {DEBUG_FLAG} or {DEBUG_ENV}=1 for the full traceback)"

EXIT_USER_ERROR = 2  # bad input: config, data, checkpoint, CLI flag
EXIT_MISSING_INPUTS = 3  # the config is valid, only files it names are missing (config.errors.MissingInputs)
EXIT_SYSTEM_ERROR = 1  # the machine: disk full, permissions, out of memory
EXIT_INTERRUPTED = 130  # 128 + SIGINT, the shell convention


class UserError(ValueError):
    """An expected failure whose message already names what is wrong and how to fix it.

    Subclasses name the area (ConfigError, CheckpointError, DataError, ...); a ValueError so
    existing `except ValueError` callers keep working. `traceback_helps`: whether the message ends
    with the hint that --debug shows the traceback (not for a config's list of problems, whose
    traceback would show only the loader)."""

    traceback_helps = True


class DataError(UserError):
    """A data file (jsonl, .zst, .bin/.idx, sample-index cache) that cannot be used as it is."""


class DiskFull(UserError):
    """No room to write (a full disk or quota: the machine, not the input): names where, how much is
    free there, what was kept and the fix."""

    exit_code = EXIT_SYSTEM_ERROR


DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def is_disk_full(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS


def free_space(path: str) -> str:
    """'N MiB free there' for the disk holding `path` (or its nearest existing parent), '' if unknown."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    try:
        return f"{shutil.disk_usage(probe).free / 2**20:.0f} MiB free there"
    except OSError:
        return ""


@contextlib.contextmanager
def writing(what: str, path: str, kept):
    """Turn a full disk inside into one DiskFull: 'the disk is full writing <what> '<path>' (N MiB
    free there); <kept>; free space there ...'. kept: what is still on disk, a string or a
    function called at the failure (e.g. the lengths evaluated so far)."""
    try:
        yield
    except OSError as e:
        if not is_disk_full(e):
            raise
        left = free_space(path)
        raise DiskFull(f"the disk is full writing {what} {path!r}{f' ({left})' if left else ''}; "
                       f"{kept() if callable(kept) else kept}; free space there or write to another disk, "
                       "then run again") from e


class OutOfMemory(UserError):
    """Out of memory, with the setting that caused it (length, batch) and the fix."""

    exit_code = EXIT_SYSTEM_ERROR


def debug_enabled() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes")


def is_out_of_memory(e: BaseException) -> bool:
    """torch's CPU and CUDA out-of-memory errors (CPU allocation failures are plain RuntimeErrors)."""
    if isinstance(e, MemoryError):
        return True
    try:
        import torch  # lazy: torch; every entry point imports this module

        if isinstance(e, torch.OutOfMemoryError):
            return True
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    text = str(e)
    return isinstance(e, RuntimeError) and ("out of memory" in text or "DefaultCPUAllocator: can't allocate" in text)


def out_of_memory(e: BaseException, what: str, fix: str) -> OutOfMemory:
    """An OutOfMemory naming `what` was running (e.g. 'evaluating length 65536 with batch size 4')."""
    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    return OutOfMemory(f"out of memory while {what} ({first}); {fix}")


def describe_os_error(e: OSError) -> str:
    """One sentence for an OSError, naming the file and, for the common errnos, the fix."""
    where = f" {e.filename!r}" if e.filename else ""
    reason = e.strerror or str(e)
    if e.errno in DISK_FULL_ERRNOS:  # a write() into an open file names no file: say so, not "there"
        if not where:
            return ("the disk is full (the system named no file; the traceback shows which write): free space on "
                    "the disk of the outputs or choose another directory")
        return f"the disk is full writing{where}: free space there or choose another directory"
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"no permission to write or read{where} ({reason}): choose a writable directory or fix its permissions"
    if e.errno == errno.ENOENT:
        return f"no such file or directory{where}: check the path"
    if e.errno == errno.ENOTDIR:
        return f"a part of the path{where} is a file, not a directory: check the path"
    if e.errno == errno.EEXIST:  # e.g. makedirs where a file of that name exists
        return f"{where.strip() or 'the path'} already exists and is in the way ({reason}): choose another path or remove it"
    return f"{reason}{where}"


def report(prog: str, message: str, hint: bool = True) -> None:
    print(f"{prog}: error: {message}", file=sys.stderr)
    if hint and not debug_enabled():
        print(f"{prog}: {DEBUG_HINT}", file=sys.stderr)


def worker_message(e: BaseException) -> str:
    """str(e) without the worker traceback torch adds when it re-raises a DataLoader worker's
    exception in the main process (type(e)("Caught X in DataLoader worker ... Original Traceback
    ...: <message>")): the user reads the original one-line message."""
    text = str(e)
    marker = f"{type(e).__name__}: "
    if text.startswith("Caught ") and "Original Traceback" in text and marker in text:
        return text.rsplit(marker, 1)[1].strip()
    return text


def expected_message(e: BaseException, expected: tuple = ()) -> tuple[str, int] | None:
    """(message, exit status) for an expected failure, None for anything else. `expected`: further
    exception types whose message is already one for the user (a tool whose library raises plain
    ValueErrors naming the bad input)."""
    if isinstance(e, UserError):
        return worker_message(e), getattr(e, "exit_code", EXIT_USER_ERROR)
    if expected and isinstance(e, expected):
        return worker_message(e), EXIT_USER_ERROR
    if is_out_of_memory(e):
        return str(out_of_memory(e, "running", "use a smaller batch size or sequence length")), EXIT_SYSTEM_ERROR
    if isinstance(e, OSError) and e.errno is not None:
        return describe_os_error(e), EXIT_SYSTEM_ERROR
    return None


def handle(prog: str, e: BaseException, expected: tuple = ()) -> int:
    """Exit status for an exception raised out of an entry point's main(); prints one message for
    expected failures, re-raises anything else (a bug keeps its traceback)."""
    if isinstance(e, KeyboardInterrupt):
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    found = expected_message(e, expected)
    if found is None:
        raise e
    if debug_enabled():
        traceback.print_exception(e)
    report(prog, found[0], getattr(e, "traceback_helps", True))
    return found[1]


_failure_hooks: list = []


def add_failure_hook(hook) -> None:
    """`hook(exception)` runs when an entry point fails, before its message: a multi-process run's
    heartbeat (megatron/process/heartbeat.py) tells the other ranks, or waits for their verdict."""
    _failure_hooks.append(hook)


def run_cli(main, prog: str, expected: tuple = ()) -> None:
    """sys.exit(main()) with the expected failures turned into one message each.

    `--debug` anywhere on the command line is removed before main() parses it and sets
    KERPLE_DEBUG=1 (so processes started by a launcher see it too)."""
    if DEBUG_FLAG in sys.argv[1:]:
        sys.argv = [a for a in sys.argv if a != DEBUG_FLAG]
        os.environ[DEBUG_ENV] = "1"

    quiet_third_party(keep_all=debug_enabled())
    prefix_rank_output()
    try:
        code = main()
    except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 - handle() re-raises what it does not expect
        for hook in _failure_hooks:
            hook(e)
        code = handle(prog, e, expected)
    sys.exit(code)
