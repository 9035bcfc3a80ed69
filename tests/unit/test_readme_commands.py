"""Every command in the bash blocks of the README and of the docs/ pages it links (its reference
moved there, issue 52), in the order a reader meets them, checked as far as it can be without
training: the script exists and its parser takes exactly those flags, each
config file that exists loads with the command's -o overrides, each `make` target is in the
Makefile, each other file it runs is there. The examples every entry point and tool prints in its
`--help` are held to the same checks (a synopsis with `[...]` is not a command; a `...` value is
one the reader fills in), and the
cheap commands run for real: every `--help`, and the README's `--dry-run`s as written from the
repository root (on a fresh clone without data they end in "config OK; missing files only"), each
holding what its comment says it prints. The commands that train or evaluate
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


def readme_pages() -> list[str]:
    """README.md, then each docs/ page it links, in the README's order (a page linked from the
    README is part of what it tells a reader to run)."""
    text = open(os.path.join(ROOT, "README.md")).read()
    linked = re.findall(r"\]\((docs/[^)#\s]+\.md)(?:#[^)]*)?\)", text)
    return ["README.md", *dict.fromkeys(linked)]


def readme_commands() -> list[tuple[list[str], str]]:
    """(words, the comment after them) of every command in the pages' bash blocks."""
    commands = []
    for page in readme_pages():
        text = open(os.path.join(ROOT, page)).read()
        for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M):
            for line in block.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # VAR=value before the command
                    words = words[1:]
                if words:
                    comment = re.search(r"(?:^|\s)#\s*(.*)$", line)
                    commands.append((words, comment.group(1) if comment else ""))
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


COMMENTED = readme_commands()
COMMANDS = [words for words, _ in COMMENTED]
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
    assert {"docs/launching.md", "docs/evaluation.md", "docs/interop.md"} <= set(readme_pages())


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


DRY_RUNS = [(c, comment) for c, comment in COMMENTED if c[:2] == ["python", "deepy.py"] and "--dry-run" in c]


@pytest.mark.parametrize("words,comment", DRY_RUNS, ids=[" ".join(c[2:5])[:60] for c, _ in DRY_RUNS])
def test_each_readme_dry_run_runs(words, comment, monkeypatch, capsys):
    """The README's dry runs, run as written from the repository root: exit 0, or (data not built
    yet) only missing input files; and what the comment says it prints, it prints (`parameters: N`,
    `exit N`, `naming FILE's data`). Issue 52: the 20B example named 20B.yml and local_setup.yml,
    which are not in the repository root, so it failed as written."""
    import yaml

    from megatron.config.errors import MissingInputs
    from megatron.errors import EXIT_MISSING_INPUTS, handle
    from megatron.launch import launcher

    monkeypatch.chdir(ROOT)
    try:
        status = launcher.main(words[2:])
    except MissingInputs as e:
        status = handle("deepy.py", e)  # deepy.py's own exit status and message
    out, err = capsys.readouterr()
    assert status in (0, EXIT_MISSING_INPUTS), err
    assert "parameters: " in out
    if claim := re.search(r"parameters: (\d[\d,]*\d)", comment):
        assert f"parameters: {claim.group(1)}\n" in out, out
    if claim := re.search(r"\bexit (\d+)", comment):
        assert status == int(claim.group(1)), err
    if claim := re.search(r"naming (\S+)'s data", comment):
        config = next(w for w in words if os.path.basename(w) == claim.group(1))
        with open(config) as f:
            data = {k.replace("-", "_"): v for k, v in yaml.safe_load(f).items()}["data_path"]
        assert f"data-path = {data!r} (from {config})" in err, err


def test_the_neox_20b_dry_run_is_one_of_them():
    """Issue 52's example stays in the pages and keeps its stated figures (checked above)."""
    twenty = [comment for words, comment in DRY_RUNS if any(w.endswith("/20B.yml") for w in words)]
    assert len(twenty) == 1 and "parameters: 20,554,567,680" in twenty[0] and "exit 3" in twenty[0]


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
    from megatron.config.overrides import parse_overrides

    load_config([os.path.join(ROOT, f) for f in files], overrides=parse_overrides(args.override))


def test_make_targets_and_other_files_exist():
    makefile = open(os.path.join(ROOT, "Makefile")).read()
    targets = set(re.findall(r"^([\w-]+):", makefile, flags=re.M))
    for words in COMMANDS:
        if words[0] == "make":
            assert words[1] in targets, f"the README runs `make {words[1]}`, which the Makefile lacks"
        elif words[0] == "sbatch":  # its script (an --array=... option may come first)
            assert os.path.isfile(os.path.join(ROOT, next(w for w in words if w.endswith(".sbatch")))), words
