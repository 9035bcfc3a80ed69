"""deepy.py: --dry-run on the paper's 2022 configs (meta device, no data), and clear errors."""
import os
import subprocess
import sys
import time

from tests.conftest import ROOT, TINY_MODEL, write_token_dataset, write_yaml

PAPER = os.path.join(ROOT, "configs", "paper")


def deepy(*args, cwd=ROOT, timeout=120):
    return subprocess.run([sys.executable, os.path.join(ROOT, "deepy.py"), *args],
                          capture_output=True, text=True, cwd=cwd, timeout=timeout)


def test_dry_run_paper_162m():
    """Settings and size print; the paper's data and GPT-2 files are not in this repository, so the
    dry run then names each of them and exits 2, as the run itself would (before starting)."""
    proc = deepy("--dry-run", "train.py", os.path.join(PAPER, "local_setup.yml"), os.path.join(PAPER, "train.yml"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    for missing in ("vocab-file = 'data/gpt2-vocab.json' (from", "merge-file", "training needs data"):
        assert missing in proc.stderr
    count = int(proc.stdout.split("parameters:")[1].split()[0].replace(",", ""))
    assert count == 162_322_968  # docs/launching.md's number, as counted by building the model
    assert "kerple_log" in proc.stdout and "bf16" in proc.stdout
    assert "50304" in proc.stdout  # GPT-2 vocab 50257 padded to a multiple of 128


def test_dry_run_with_length_file_and_override(tmp_path):
    data = write_token_dataset(str(tmp_path / "corpus"), num_docs=5)
    proc = deepy("--dry-run", "train.py", os.path.join(PAPER, "local_setup.yml"), os.path.join(PAPER, "ex_eval.yml"),
                 os.path.join(PAPER, "lengths", "length_4096.yml"), "-o", "pos-emb=rotary", "-o", f"data-path={data}",
                 "-o", "padded-vocab-size=50304")
    assert proc.returncode == 0, proc.stderr
    assert "rotary" in proc.stdout and "4096" in proc.stdout


def test_unknown_and_bad_keys_fail_once_with_all_problems(tmp_path):
    bad = write_yaml(tmp_path / "bad.yml", {"num-layer": 2, "hiden-size": 8, "num-attention-heads": "x",
                                           "seq-length": 16, "train-iters": 1})
    proc = deepy("--dry-run", "train.py", bad)
    assert proc.returncode == 2
    err = proc.stderr
    assert "num-layer" in err and "num-layers" in err and "hiden-size" in err and "hidden-size" in err


def test_missing_file_and_bad_override(tmp_path):
    proc = deepy("--dry-run", "train.py", str(tmp_path / "nope.yml"))
    assert proc.returncode == 2 and "nope.yml" in proc.stderr
    # no close name beside it: a file of that name elsewhere in the checkout (NeoX's 20B.yml from the root)
    proc = deepy("--dry-run", "train.py", "20B.yml")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "config file not found: 20B.yml" in proc.stderr
    assert "did you mean tests/fixtures/neox_configs/20B.yml?" in proc.stderr, proc.stderr
    proc = deepy("--dry-run", "train.py", os.path.join(PAPER, "train.yml"), "-o", "pos-emb")
    assert proc.returncode != 0 and "KEY=VALUE" in proc.stderr
    proc = deepy("--dry-run", "train.py", os.path.join(PAPER, "train.yml"), "-o", "weight-decay=.inf")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "weight-decay = inf (from -o on the command line): not a finite number" in proc.stderr


def test_dry_run_answers_in_seconds_for_any_depth():
    """100,000 layers: the count is arithmetic, not a model built layer by layer (no answer in
    120 s before); the time is mostly Python and torch start-up."""
    start = time.time()
    proc = deepy("--dry-run", "train.py", os.path.join(PAPER, "local_setup.yml"), os.path.join(PAPER, "train.yml"),
                 "-o", "num-layers=100000", timeout=60)
    assert time.time() - start < 30, proc.stdout
    assert "100000 layers" in proc.stdout
    # the paper's 162,322,968 = 12 layers of 7,087,872 + untied embeddings 2 * 50304 * 768 + the
    # final norm 2 * 768 + kerple_log's 2 parameters per head; now with 100,000 layers:
    expected = 100_000 * 7_087_872 + 2 * 50304 * 768 + 2 * 768 + 2 * 12
    assert f"parameters: {expected:,}" in proc.stdout, proc.stdout


def test_missing_inputs_fail_at_once_before_anything_is_written(tmp_path):
    """Data, tokenizer and load paths are checked before the run directory is created or
    DeepSpeed starts (it used to fail 84 s later, after building the engine; --dry-run passed)."""
    cfg = write_yaml(tmp_path / "run.yml", {
        **TINY_MODEL, "train-iters": 5, "data-path": str(tmp_path / "no_such_prefix"),
        "padded-vocab-size": None, "tokenizer-type": "HFTokenizer", "vocab-file": str(tmp_path / "tok.json"),
        "load": str(tmp_path / "old_run"), "run-dir": str(tmp_path / "run")})
    for dry in (["--dry-run"], []):
        start = time.time()
        proc = deepy(*dry, "train.py", cfg)
        # the config itself is fine: its own exit status, told apart from a config error (2)
        assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr
        assert time.time() - start < 30
        err = proc.stderr
        assert "config OK; missing files only (3 inputs)" in err and "run.yml" in err
        assert "no_such_prefix.bin and" in err and "vocab-file" in err and "old_run" in err
        assert f"load {tmp_path / 'old_run'} is outside run-dir" in proc.stdout  # announced at start
    assert not (tmp_path / "run").exists()
    # train.py run directly checks the same, before DeepSpeed
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), cfg], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 3 and "no_such_prefix.bin" in proc.stderr and "Traceback" not in proc.stderr


def test_deepy_run_keeps_original_configs_in_checkpoints_and_follows_run_dir(tmp_path):
    """A deepy-launched run's checkpoint holds configs/<each yml> (docs/launching.md's claim: it held only
    resolved_config.yml, the launcher's copy), and -o run-dir moves checkpoints and TensorBoard."""
    from tests.conftest import train_config_dict
    from tests.integration.fault_helpers import child_env, free_port

    data = train_config_dict(tmp_path, write_token_dataset(str(tmp_path / "corpus"), num_docs=40), train_iters=2,
                             save_interval=2)
    del data["run-dir"]
    base = write_yaml(tmp_path / "base.yml", data)
    extra = write_yaml(tmp_path / "extra.yml", {"seed": 7})
    run_dir = tmp_path / "moved"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "deepy.py"), "train.py", base, extra, "-o",
                           f"run-dir={run_dir}", "-o", f"master-port={free_port()}"],
                          capture_output=True, text=True, cwd=ROOT, env=child_env(), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    step = run_dir / "checkpoints" / "global_step2"
    assert sorted(os.listdir(step / "configs")) == ["base.yml", "extra.yml"]
    assert (step / "configs" / "extra.yml").read_text() == (tmp_path / "extra.yml").read_text()
    assert os.listdir(run_dir / "tensorboard")
