"""The experiment-matrix generator: one loadable YAML per (scheme, dataset, seed)."""
import json
import os

import pytest
import torch

from megatron.config import load_config
from study.experiments import RPE_LABEL, parse_data, read_matrix, write_matrix
from tests.conftest import ROOT

PAPER = [os.path.join(ROOT, "configs", "paper", f) for f in ("local_setup.yml", "train.yml")]


def test_matrix_files_load_on_top_of_the_paper_configs(tmp_path):
    runs = write_matrix(["kerple_log", "alibi"], parse_data(["github=data/github/github_text_document"]),
                        [1235, 1236], str(tmp_path / "exp"), "runs/m", PAPER)
    assert [r.name for r in runs] == ["kerple_log_github_1235", "alibi_github_1235",
                                      "kerple_log_github_1236", "alibi_github_1236"]
    cfg = load_config(PAPER + [runs[1].config])
    assert cfg.model.pos_emb == "alibi" and cfg.training.seed == 1235
    assert cfg.checkpoint.save == cfg.checkpoint.load == "runs/m/alibi_github_1235/checkpoints"
    assert cfg.data.data_path == "data/github/github_text_document"
    base, again = read_matrix(str(tmp_path / "exp" / "matrix.json"))
    assert base == PAPER and again == runs
    assert json.loads(open(runs[0].config).read())["pos-emb"] == "kerple_log"


def test_bad_inputs():
    with pytest.raises(ValueError, match="NAME=DATA_PREFIX"):
        parse_data(["github"])
    with pytest.raises(ValueError, match="unknown schemes"):
        write_matrix(["kerple_logg"], {"x": "p"}, [1], "/tmp/unused-matrix", "runs", [])
    with pytest.raises(ValueError, match="does not exist"):
        read_matrix("/nonexistent/matrix.json")


def test_per_dataset_tokenizers(tmp_path):
    """Domains with their own tokenizer: each run's YAML sets its dataset's vocab-file."""
    data = parse_data(["code=data/code/code_text_document", "web=data/web/web_text_document"])
    runs = write_matrix(["alibi"], data, [1], str(tmp_path / "exp"), "runs/m", PAPER,
                        vocab_files=parse_data(["code=data/code/tokenizer.json"], "NAME=TOKENIZER_FILE"))
    code, web = (json.loads(open(r.config).read()) for r in runs)
    assert code["vocab-file"] == "data/code/tokenizer.json" and "vocab-file" not in web
    with pytest.raises(ValueError, match="--vocab for datasets not in --data: latex"):
        write_matrix(["alibi"], data, [1], str(tmp_path / "exp2"), "runs/m", PAPER, vocab_files={"latex": "t.json"})
    with pytest.raises(ValueError, match="--vocab 'code' must look like NAME=TOKENIZER_FILE"):
        parse_data(["code"], "NAME=TOKENIZER_FILE")


def test_length_settings_scale_with_the_train_length():
    from megatron.positional.rpe import rpe_bucket
    from study.experiments import length_settings

    s = length_settings(128, 1024)
    assert s["seq-length"] == s["max-position-embeddings"] == 128 and s["train_micro_batch_size_per_gpu"] == 8
    assert (s["fire-init-threshold"], s["xpos-scale-base"], s["rpe-max-distance"]) == (32, 64, 128)
    for L in (64, 128, 256):  # every T5 bucket gets training distances 0..L-1 (v2's 128 at L = 64 left 27-31 idle)
        used = set(rpe_bucket(torch.arange(L), 32, length_settings(L, 1024)["rpe-max-distance"]).tolist())
        assert used == set(range(32)), L
    assert set(rpe_bucket(torch.arange(64), 32, 128).tolist()) == set(range(27))  # the v2 handicap
    assert 20 not in set(rpe_bucket(torch.arange(64), 32, 32).tolist())  # L/2 would skip a bucket
    for bad in (32, 100, 3000):  # below T5's exact buckets, not a multiple of 4, does not divide the tokens
        with pytest.raises(ValueError, match="train length"):
            length_settings(bad, 1024)
    # the same sequences per step at every length: the micro batch stays, the tokens grow with L
    assert [length_settings(L, sequences_per_step=16)["train_micro_batch_size_per_gpu"] for L in (64, 256)] == [16, 16]
    assert length_settings(3000 - 8, sequences_per_step=16)["seq-length"] == 2992  # no token count to divide
    with pytest.raises(ValueError, match=r"multiple of 4 and at least 64 \(below it T5's log-spaced buckets skip distances\)$"):
        length_settings(98, sequences_per_step=16)  # no token count to name
    for both_or_neither in ({}, {"tokens_per_step": 1024, "sequences_per_step": 16}):
        with pytest.raises(ValueError, match="one of them"):
            length_settings(128, **both_or_neither)


def test_sequences_per_step_from_the_command_line(tmp_path):
    import subprocess
    import sys

    cmd = [sys.executable, os.path.join(ROOT, "tools", "make_experiments.py"), "--out", str(tmp_path / "m"),
           "--base", os.path.join(ROOT, "configs", "repro_cpu_v2", "base.yml"), "--schemes", "kerple_log",
           "--data", "latex=d/latex", "--seeds", "1", "--train-lengths", "64,256"]
    out = subprocess.run(cmd + ["--sequences-per-step", "16"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    base, runs = read_matrix(str(tmp_path / "m" / "matrix.json"))
    assert [json.loads(open(r.config).read())["train_micro_batch_size_per_gpu"] for r in runs] == [16, 16]
    both = subprocess.run(cmd + ["--sequences-per-step", "16", "--tokens-per-step", "1024"], capture_output=True,
                          text=True, cwd=ROOT)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr and "Traceback" not in both.stderr
    neither = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert neither.returncode == 2 and "sequences_per_step" in neither.stderr and "Traceback" not in neither.stderr


def test_train_length_matrix_names_order_and_configs(tmp_path):
    data = parse_data(["latex=d/latex", "code=d/code"])
    runs = write_matrix(["kerple_log", "rpe"], data, [1, 2], str(tmp_path / "exp"), "runs/v3", PAPER,
                        train_lengths=[128, 256], tokens_per_step=1024, order="dataset")
    assert [r.name for r in runs[:5]] == ["kerple_log_latex_L128_1", "rpe_latex_L128_1", "kerple_log_latex_L256_1",
                                          "rpe_latex_L256_1", "kerple_log_latex_L128_2"]
    assert {r.dataset for r in runs[:8]} == {"latex"} and len(runs) == 16
    assert [r.train_length for r in runs[:4]] == [128, 128, 256, 256]
    assert [r.label for r in runs[:2]] == [None, RPE_LABEL]  # T5 with scaled buckets is its own report row
    cfg = load_config(PAPER + [runs[3].config])
    assert cfg.model.seq_length == 256 and cfg.model.rpe_max_distance == 256
    assert cfg.training.train_micro_batch_size_per_gpu * 256 == 1024
    _, again = read_matrix(str(tmp_path / "exp" / "matrix.json"))
    assert again == runs
    with pytest.raises(ValueError, match="tokens_per_step"):
        write_matrix(["alibi"], data, [1], str(tmp_path / "e2"), "r", PAPER, train_lengths=[128])
    with pytest.raises(ValueError, match="order"):
        write_matrix(["alibi"], data, [1], str(tmp_path / "e3"), "r", PAPER, order="scheme")


def test_set_gives_every_run_a_checked_config_key(tmp_path):
    """--set KEY=VALUE (the v3 trend's warmup=0.1): JSON values, checked against the base configs
    before any file is written; a misspelt key names the fix."""
    import subprocess
    import sys

    base = os.path.join(ROOT, "configs", "repro_cpu_v2", "base.yml")
    tool = os.path.join(ROOT, "tools", "make_experiments.py")
    cmd = [sys.executable, tool, "--base", base, "--schemes", "alibi", "--data", "latex=d/latex", "--seeds", "1",
           "--train-lengths", "64,128", "--tokens-per-step", "1024"]
    ok = subprocess.run(cmd + ["--out", str(tmp_path / "ok"), "--set", "warmup=0.1", "min-lr=0.0005"],
                        capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0, ok.stderr
    _, runs = read_matrix(str(tmp_path / "ok" / "matrix.json"))
    cfg = load_config([base, runs[1].config])
    assert cfg.optimizer.warmup == 0.1 and cfg.optimizer.min_lr == 0.0005 and cfg.model.seq_length == 128
    for bad, words in ((["warmpu=0.1"], ("unknown key 'warmpu'", "did you mean 'warmup'")),
                       (["warmup=abc"], ("warmup", "expected float")),
                       (["warmup"], ("KEY=VALUE",))):
        out = subprocess.run(cmd + ["--out", str(tmp_path / "bad"), "--set", *bad], capture_output=True, text=True,
                             cwd=ROOT)
        assert out.returncode == 2 and "Traceback" not in out.stderr
        assert all(w in out.stderr for w in ("--set", *words)), out.stderr
        assert not (tmp_path / "bad").exists()  # refused before anything was written


def _shipped_matrices():
    import glob

    return sorted(glob.glob(os.path.join(ROOT, "configs", "**", "matrix.json"), recursive=True))


@pytest.mark.parametrize("matrix", _shipped_matrices(), ids=lambda p: os.path.relpath(p, ROOT))
def test_every_shipped_matrix_run_loads_with_its_base_configs(matrix):
    """What run_matrix.py will train, stack and all (a run's YAML alone is only a fragment): a bad key
    or value in a committed matrix would otherwise surface on the lent GPU or hours into a CPU matrix."""
    base, runs = read_matrix(matrix)
    for r in runs:
        cfg = load_config([os.path.join(ROOT, p) for p in base] + [os.path.join(ROOT, r.config)])
        assert cfg.model.pos_emb == r.scheme and cfg.training.seed == r.seed
        if r.train_length:
            assert cfg.model.seq_length == r.train_length


def test_gpu_matrix_is_the_papers_model_at_512_in_bf16():
    """Issue 24's GPU part: the paper's 162M shape, train length 512, 32 x 512 tokens per step, bf16."""
    base, runs = read_matrix(os.path.join(ROOT, "configs", "repro_gpu_v3", "code_162M", "matrix.json"))
    assert [r.scheme for r in runs] == ["kerple_log", "kerple_power_ap_", "alibi", "rotary", "rpe"]
    cfg = load_config([os.path.join(ROOT, p) for p in base] + [os.path.join(ROOT, runs[0].config)])
    assert (cfg.model.num_layers, cfg.model.hidden_size, cfg.model.num_attention_heads) == (12, 768, 12)
    assert cfg.model.seq_length == 512 and cfg.training.train_micro_batch_size_per_gpu == 32
    assert cfg.precision.dtype == "bf16" and cfg.training.train_iters == 500
