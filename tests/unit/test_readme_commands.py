"""Every command in the README's bash blocks, in the order a reader meets them, checked as far as
it can be without training: the script exists and its parser takes exactly those flags, each
config file that exists loads with the command's -o overrides, each `make` target is in the
Makefile, each other file it runs is there. The examples every entry point and tool prints in its
`--help` are held to the same checks (a synopsis with `[...]` is not a command; a `...` value is
one the reader fills in), and the
cheap commands run for real: every `--help`, and the README's `--dry-run`s (on a fresh clone
without data they end in "config OK; missing files only"). The commands that train or evaluate
(the quickstart, the HF round trip, the extension recipe) were run by hand from a fresh clone; see
the README's dates. Nothing is trained and no model is built (~10 s)."""
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


ENTRY_POINTS = ["deepy.py", "train.py", "evaluate.py", "eval.py", "generate.py"]


def help_text(script: str) -> str:
    """What `python SCRIPT --help` prints (run in this process); fails the collection if it fails."""
    import contextlib
    import io

    out, saved = io.StringIO(), list(sys.argv)
    sys.argv = [script, "--help"]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            runpy.run_path(os.path.join(ROOT, script), run_name="__main__")
    except SystemExit as e:
        assert e.code in (0, None), f"{script} --help exited {e.code}"
    finally:
        sys.argv = saved
    return out.getvalue()


def help_examples() -> list[list[str]]:
    """Every `python ...` example line of every entry point's and tool's --help (synopses aside)."""
    import glob

    scripts = ENTRY_POINTS + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "tools", "*.py")))
    examples = []
    for script in scripts:
        for line in help_text(script).replace("\\\n", " ").splitlines():
            line = line.strip()
            if not line.startswith("python ") or "[" in line or " & " in line:  # a synopsis, or two commands
                continue
            words = shlex.split(line, comments=True)
            if words[2:3] == ["..."]:  # "the command above, and": not a command of its own
                continue
            while words[-1] == "...":  # "and more flags"
                words.pop()
            examples.append(["X" if w == "..." else w for w in words])  # a value left to the reader
    return examples


COMMANDS = readme_commands()
PYTHON = [c for c in COMMANDS if c[0] == "python" and c[1].endswith(".py")]
HELP_EXAMPLES = help_examples()


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
    _parses(words, monkeypatch)


@pytest.mark.parametrize("words", HELP_EXAMPLES, ids=[" ".join(c[1:4])[:60] for c in HELP_EXAMPLES])
def test_each_help_example_parses(words, parse_only, monkeypatch):
    """Issue 45: import_hf.py's --help suggested `evaluate.py ... --data-path`, a flag evaluate.py lacks."""
    _parses(words, monkeypatch)


def test_the_help_examples_are_collected():
    assert len(HELP_EXAMPLES) >= 40
    assert any(w[1] == "tools/import_hf.py" for w in HELP_EXAMPLES)


def _parses(words, monkeypatch):
    script = os.path.join(ROOT, words[1])
    assert os.path.isfile(script), f"{' '.join(words)}: {words[1]} does not exist"
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


DRY_RUNS = [c for c in PYTHON if c[1] == "deepy.py" and "--dry-run" in c]


@pytest.mark.parametrize("words", DRY_RUNS, ids=[" ".join(c[2:5])[:60] for c in DRY_RUNS])
def test_each_readme_dry_run_runs(words, monkeypatch, capsys):
    """The README's dry runs, run: exit 0, or (data not built yet) only missing input files."""
    from megatron import launcher
    from megatron.config.errors import MissingInputs

    monkeypatch.chdir(ROOT)
    try:
        assert launcher.main(words[2:]) == 0
    except MissingInputs:
        pass
    assert "parameters: " in capsys.readouterr().out


def test_the_readme_evaluations_write_apart():
    """Issue 45: the README's evaluation examples, run in order, refused the second: each wrote the
    checkpoint's eval/, which the first (or the quickstart) already held. Every evaluate.py command of
    the README on one checkpoint after the quickstart's names its own --out."""
    outs = {ck: [os.path.join(os.path.dirname(ck), "eval")]  # make quickstart, make quickstart-rotary
            for ck in ("runs/quickstart/checkpoints", "runs/quickstart_rotary/checkpoints")}
    for words in PYTHON:
        if words[1] != "evaluate.py" or "--tasks" in words:
            continue
        ck = words[words.index("--checkpoint") + 1]
        out = words[words.index("--out") + 1] if "--out" in words else os.path.join(os.path.dirname(ck), "eval")
        assert out not in outs.get(ck, []) or "--overwrite" in words, f"{' '.join(words)}: {out} written before"
        outs.setdefault(ck, []).append(out)


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
