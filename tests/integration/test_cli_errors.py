"""Every entry point goes through megatron.errors.run_cli: a bad input ends in one message that
names the problem, a non-zero exit and no traceback; --debug (or KERPLE_DEBUG=1) shows the
traceback. Each case here is cheap: it fails before any model is trained or loaded."""
import json
import os
import subprocess
import sys

from tests.conftest import ROOT, train_config_dict, write_yaml
from tests.integration.fault_helpers import child_env


def cli(script: str, *args: str) -> subprocess.CompletedProcess:
    env = child_env()
    env.pop("KERPLE_DEBUG", None)
    return subprocess.run([sys.executable, os.path.join(ROOT, script), *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=180)


def one_message(proc: subprocess.CompletedProcess, prog: str, *words: str) -> None:
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"{prog}: error:" in proc.stderr, proc.stderr[-3000:]
    for w in words:
        assert w in proc.stderr, (w, proc.stderr[-3000:])
    # the hint, except after a config's list of problems (its traceback would show only the loader)
    config_list = "invalid configuration" in proc.stderr or "config OK; missing files only" in proc.stderr
    assert ("--debug" in proc.stderr) != config_list, proc.stderr[-3000:]


def test_train_error_is_one_message_and_debug_shows_the_traceback(tmp_path, token_dataset):
    conf = write_yaml(tmp_path / "fp16.yml", dict(train_config_dict(tmp_path, token_dataset), fp16={"enabled": True}))
    one_message(cli("train.py", conf), "train.py", "fp16 training needs a GPU")
    debug = cli("train.py", conf, "--debug")
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "fp16 training needs a GPU" in debug.stderr
    # through deepy.py (training runs in its process): the same message, and --debug reaches train.py
    one_message(cli("deepy.py", "train.py", conf), "train.py", "fp16 training needs a GPU")
    debug = cli("deepy.py", "--debug", "train.py", conf)
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "fp16 training needs a GPU" in debug.stderr


def test_deepy_debug_shows_the_traceback(tmp_path):
    conf = os.path.join(ROOT, "configs", "paper", "train.yml")
    one_message(cli("deepy.py", "--dry-run", "train.py", conf, "-o", "pos-emb"), "deepy.py", "KEY=VALUE")
    debug = cli("deepy.py", "--debug", "--dry-run", "train.py", conf, "-o", "pos-emb")
    assert debug.returncode == 2 and "Traceback" in debug.stderr and "KEY=VALUE" in debug.stderr


def test_evaluate_checks_the_output_directory_before_loading(tmp_path):
    blocker = tmp_path / "results"
    blocker.write_text("")  # a file where the output directory's parent should be
    out = blocker / "eval"
    proc = cli("evaluate.py", "--checkpoint", str(tmp_path / "no_checkpoint_here"), "--out", str(out))
    one_message(proc, "evaluate.py", str(out), "--out", "nothing was evaluated")
    assert "no_checkpoint_here" not in proc.stderr  # refused before the checkpoint was looked at
    # a writable new directory passes the check and is not left behind when the run then fails
    fresh = tmp_path / "new" / "eval"
    proc = cli("evaluate.py", "--checkpoint", str(tmp_path / "no_checkpoint_here"), "--out", str(fresh))
    one_message(proc, "evaluate.py", "no_checkpoint_here")
    assert not (tmp_path / "new").exists()


def test_generate_reads_the_prompt_file_before_loading(tmp_path):
    missing = tmp_path / "prompts.txt"
    proc = cli("generate.py", "--checkpoint", str(tmp_path / "no_checkpoint_here"), "--prompt-file", str(missing))
    one_message(proc, "generate.py", str(missing))


def test_tools_errors_are_one_message(tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_text("")
    # an OSError: the output cannot be created (was a FileExistsError traceback)
    one_message(cli("tools/gen_config_docs.py", "--output", str(blocker / "config.md")), "gen_config_docs.py",
                str(blocker))
    # a bad flag value (was "invalid literal for int()")
    one_message(cli("tools/make_experiments.py", "--out", str(tmp_path / "m"), "--base",
                    os.path.join(ROOT, "configs", "paper", "train.yml"), "--schemes", "alibi", "--data", "a=b",
                    "--seeds", "abc"), "make_experiments.py", "--seeds 'abc'")
    # the output prefix cannot be written after the input was read (was a traceback)
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"text": "hello world"}) + "\n")
    proc = cli("tools/preprocess_data.py", "--input", str(src), "--tokenizer-type", "CharLevelTokenizer",
               "--output-prefix", str(blocker / "out"))
    one_message(proc, "preprocess_data.py", str(blocker))
    # a missing input file of a report tool
    one_message(cli("tools/run_matrix.py", str(tmp_path / "matrix.json")), "run_matrix.py", "matrix.json")
