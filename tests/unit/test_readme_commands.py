"""Every command in the README's bash blocks, in the order a reader meets them, checked as far as
it can be without training: the script exists and its parser takes exactly those flags, each
config file that exists loads with the command's -o overrides, each `make` target is in the
Makefile, each other file it runs is there. The commands that train or evaluate (the quickstart,
the HF round trip, the extension recipe) were run by hand from a fresh clone; see the README's
dates. Cheap: nothing is trained and no model is built (~2 s)."""
from __future__ import annotations

import os
import re
import runpy
import shlex
import sys

import pytest

from megatron import cli_args
from tests.conftest import ROOT


def readme_commands() -> list[list[str]]:
    text = open(os.path.join(ROOT, "README.md")).read()
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # VAR=value before the command
                words = words[1:]
            if words:
                commands.append(words)
    return commands


COMMANDS = readme_commands()
PYTHON = [c for c in COMMANDS if c[0] == "python" and c[1].endswith(".py")]


class _Parsed(BaseException):  # not an Exception: run_cli lets it through untouched
    def __init__(self, namespace, extras):
        super().__init__()
        self.namespace, self.extras = namespace, extras


@pytest.fixture
def parse_only(monkeypatch):
    """Every CLI parses with megatron.cli_args.ArgumentParser: stop right after its parse."""
    parse = cli_args.ArgumentParser.parse_known_args

    def parsed(self, args=None, namespace=None):
        ns, extras = parse(self, args, namespace)
        raise _Parsed(ns, extras)

    monkeypatch.setattr(cli_args.ArgumentParser, "parse_known_args", parsed)


def test_the_readme_has_the_commands_a_reader_needs():
    assert [c[:2] for c in COMMANDS[:2]] == [["make", "quickstart"], ["make", "test"]]
    assert len(PYTHON) >= 25


@pytest.mark.parametrize("words", PYTHON, ids=[" ".join(c[1:3])[:60] for c in PYTHON])
def test_each_python_command_parses(words, parse_only, monkeypatch):
    script = os.path.join(ROOT, words[1])
    assert os.path.isfile(script), f"the README runs {words[1]}, which does not exist"
    monkeypatch.setattr(sys, "argv", words[1:])
    monkeypatch.chdir(ROOT)
    with pytest.raises(_Parsed) as parsed:
        runpy.run_path(script, run_name="__main__")
    extras = parsed.value.extras
    if words[1:3] == ["deepy.py", "evaluate.py"]:  # the flags after the configs are evaluate.py's: it must take them
        monkeypatch.setattr(sys, "argv", ["evaluate.py", "--checkpoint", "CKPT", *extras])
        with pytest.raises(_Parsed) as evaluate_parsed:
            runpy.run_path(os.path.join(ROOT, "evaluate.py"), run_name="__main__")
        extras = evaluate_parsed.value.extras
    assert extras == [], f"{' '.join(words)}: {words[1]} does not take {extras}"
    if words[1] == "deepy.py":
        _load_its_config(parsed.value.namespace)


def _load_its_config(args):
    """The config files a deepy.py command names load with its -o overrides (those it names that a
    reader writes or an earlier command produces are left out of this check)."""
    files = [os.path.join(args.conf_dir or "", f) for f in args.conf_file]
    if not all(os.path.isfile(os.path.join(ROOT, f)) for f in files):
        return
    from megatron.config import load_config
    from megatron.launcher import parse_overrides

    load_config([os.path.join(ROOT, f) for f in files], overrides=parse_overrides(args.override))


def test_make_targets_and_other_files_exist():
    makefile = open(os.path.join(ROOT, "Makefile")).read()
    targets = set(re.findall(r"^([\w-]+):", makefile, flags=re.M))
    for words in COMMANDS:
        if words[0] == "make":
            assert words[1] in targets, f"the README runs `make {words[1]}`, which the Makefile lacks"
        elif words[0] == "sbatch":  # its script (an --array=... option may come first)
            assert os.path.isfile(os.path.join(ROOT, next(w for w in words if w.endswith(".sbatch")))), words
