"""The top-level handler: one message for expected failures, the traceback for bugs."""
import errno
import sys

import pytest

from megatron import errors
from megatron.checkpoint.errors import CheckpointError, UnsafeCheckpointError
from megatron.config import ConfigError
from megatron.data.indexed import IndexedDatasetError


@pytest.fixture(autouse=True)
def no_debug_leak(monkeypatch):
    """run_cli sets KERPLE_DEBUG in os.environ itself; setenv first so monkeypatch restores it
    (a leaked KERPLE_DEBUG=1 changes what later tests see, e.g. the launcher's runner args)."""
    monkeypatch.setenv(errors.DEBUG_ENV, "")
    monkeypatch.delenv(errors.DEBUG_ENV)


def run(main, argv=("prog",), monkeypatch=None):
    monkeypatch.setattr(sys, "argv", list(argv))
    with pytest.raises(SystemExit) as exc:
        errors.run_cli(main, "prog")
    return exc.value.code


@pytest.mark.parametrize("cls", [ConfigError, CheckpointError, IndexedDatasetError, UnsafeCheckpointError,
                                 errors.DataError])
def test_our_errors_are_user_errors(cls, monkeypatch, capsys):
    monkeypatch.delenv(errors.DEBUG_ENV, raising=False)

    def main():
        raise cls("the file x.bin is broken; rebuild it")

    assert run(main, monkeypatch=monkeypatch) == errors.EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert "prog: error:" in err and "x.bin" in err and "Traceback" not in err
    assert ("--debug" in err) == (cls is not ConfigError)  # a config's list of problems: no traceback hint


def test_disk_full_names_the_file(monkeypatch, capsys):
    monkeypatch.delenv(errors.DEBUG_ENV, raising=False)

    def main():
        raise OSError(errno.ENOSPC, "No space left on device", "/ckpt/global_step4/x.pt")

    assert run(main, monkeypatch=monkeypatch) == errors.EXIT_SYSTEM_ERROR
    err = capsys.readouterr().err
    assert "disk is full" in err and "/ckpt/global_step4/x.pt" in err and "Traceback" not in err


def test_out_of_memory_is_one_message(monkeypatch, capsys):
    monkeypatch.delenv(errors.DEBUG_ENV, raising=False)

    def main():
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 999 bytes")

    assert run(main, monkeypatch=monkeypatch) == errors.EXIT_SYSTEM_ERROR
    assert "out of memory" in capsys.readouterr().err


def test_bugs_keep_their_traceback(monkeypatch):
    def main():
        raise KeyError("a bug")

    monkeypatch.setattr(sys, "argv", ["prog"])
    with pytest.raises(KeyError):
        errors.run_cli(main, "prog")


def test_debug_flag_is_removed_and_shows_traceback(monkeypatch, capsys):
    monkeypatch.delenv(errors.DEBUG_ENV, raising=False)
    seen = {}

    def main():
        seen["argv"] = list(sys.argv)
        raise ConfigError("bad key")

    assert run(main, ("prog", "--debug", "a.yml"), monkeypatch) == errors.EXIT_USER_ERROR
    assert seen["argv"] == ["prog", "a.yml"]
    err = capsys.readouterr().err
    assert "Traceback" in err and "bad key" in err


def test_keyboard_interrupt_exits_130(monkeypatch, capsys):
    def main():
        raise KeyboardInterrupt

    assert run(main, monkeypatch=monkeypatch) == errors.EXIT_INTERRUPTED
    assert "Traceback" not in capsys.readouterr().err


def test_a_tool_can_expect_plain_value_errors(monkeypatch, capsys):
    """Tools whose libraries raise plain ValueErrors naming the bad input list them as expected;
    without that a ValueError is a bug and keeps its traceback."""
    monkeypatch.delenv(errors.DEBUG_ENV, raising=False)

    def main():
        raise ValueError("no result files matched ['x/*.json']")

    monkeypatch.setattr(sys, "argv", ["prog"])
    with pytest.raises(SystemExit) as exc:
        errors.run_cli(main, "prog", expected=(ValueError,))
    assert exc.value.code == errors.EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert "x/*.json" in err and "Traceback" not in err
    with pytest.raises(ValueError):
        errors.run_cli(main, "prog")


def test_a_file_in_the_way_is_named(tmp_path):
    """makedirs over a file (EEXIST) or a file used as a directory (ENOTDIR): say what is in the way."""
    import os

    blocker = tmp_path / "results"
    blocker.write_text("")
    with pytest.raises(OSError) as exists:
        os.makedirs(blocker)
    with pytest.raises(OSError) as notdir:
        open(blocker / "eval.json", "w")
    assert str(blocker) in errors.describe_os_error(exists.value)
    assert "already exists" in errors.describe_os_error(exists.value)
    assert "is a file, not a directory" in errors.describe_os_error(notdir.value)
