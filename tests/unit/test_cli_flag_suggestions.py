"""A misspelt flag gets "did you mean" on every entry point (megatron/cli_args.ArgumentParser):
argparse alone says "the following arguments are required: --checkpoint" for `--chekpoint X`."""
import subprocess
import sys

import pytest

from megatron.cli_args import ArgumentParser
from tests.conftest import ROOT


def test_the_parser_names_the_flag_a_typo_meant(capsys):
    p = ArgumentParser(prog="tool")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--max-factor", type=int)
    with pytest.raises(SystemExit) as e:
        p.parse_args(["--chekpoint", "ck", "--max-facter=4"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "required: --checkpoint" in err
    assert "--chekpoint: did you mean --checkpoint?" in err and "--max-facter: did you mean --max-factor?" in err


def test_abbreviations_argparse_accepts_are_not_flagged(capsys):
    p = ArgumentParser(prog="tool")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--out")
    with pytest.raises(SystemExit):
        p.parse_args(["--check", "ck", "--bogus"])
    err = capsys.readouterr().err
    assert "--check:" not in err and "unrecognized arguments: --bogus" in err


@pytest.mark.parametrize("argv,hint", [
    (["evaluate.py", "--chekpoint", "ck"], "--chekpoint: did you mean --checkpoint?"),
    (["tools/import_hf.py", "--inptu", "a", "--output", "b"], "--inptu: did you mean --input?"),
    (["deepy.py", "--dry-rn", "train.py", "x.yml"], "--dry-rn: did you mean --dry-run?"),
])
def test_every_entry_point_suggests(argv, hint):
    proc = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and hint in proc.stderr, proc.stderr
