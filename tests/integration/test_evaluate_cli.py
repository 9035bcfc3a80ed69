"""evaluate.py on a freshly trained tiny checkpoint: one process, every length, JSON schema."""
import json
import os
import shutil
import subprocess
import sys

from megatron.config import load_config
from tests.conftest import ROOT, train_config_dict, write_yaml


def test_evaluate_cli_writes_schema(tmp_path, token_dataset):
    from megatron.training.trainer import Trainer

    ck = str(tmp_path / "ck")
    data = train_config_dict(tmp_path, token_dataset, train_iters=4, save=ck, save_interval=4)
    Trainer(load_config([write_yaml(tmp_path / "t.yml", data)])).train()
    out = tmp_path / "eval"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "evaluate.py"), "--checkpoint", ck, "--lengths", "32,64,128",
         "--max-tokens", "512", "--out", str(out), "--quiet", "--plots"],  # the suite's default is --no-plots
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    for png in ("ppl_vs_length.png", "positionwise.png", "kernels.png"):  # kerple_log: a learned kernel
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png in proc.stdout, png
    rec = json.loads((out / "eval.json").read_text())
    assert rec["schema"] == "kerple-eval/1"
    assert rec["lengths"] == [32, 64, 128] and rec["train_length"] == 32 and rec["iteration"] == 4
    assert set(rec["perplexity"]) == {"32", "64", "128"}
    for r in rec["results"]:
        assert set(r) == {"length", "loss", "ppl", "windows", "windows_requested", "tokens", "seconds"}
        assert r["windows"] >= 1 and r["tokens"] == r["windows"] * r["length"] and r["ppl"] > 1
    curve = rec["positionwise"]["128"]
    assert curve["bin_size"] == 1 and len(curve["loss"]) == 128
    for name in ("eval.csv", "eval.md", "positionwise.csv"):
        assert (out / name).stat().st_size > 0
    assert "| 128 | 4 |" in (out / "eval.md").read_text()
    assert "full causal attention" in (out / "eval.md").read_text().splitlines()[0] and "full causal" in proc.stdout
    assert rec["seed"] == 1234 and rec["dataset"] == "tiny" and rec["mode"] == "non-overlapping"
    assert rec["train_speed"]["sec_per_step"] > 0
    assert rec["device_name"].startswith(("cpu (", "cuda:"))  # the report names where each result was scored

    # strided mode, two checkpoints in one call: one output directory each, though both are named ck
    multi, copy = tmp_path / "multi", tmp_path / "copy" / "ck"
    shutil.copytree(ck, copy)
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "evaluate.py"), "--checkpoint", ck, str(copy), "--lengths", "32,64",
         "--stride", "16", "--max-tokens", "256", "--data-seed", "7", "--out", str(multi), "--quiet"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(multi)) == sorted([f"{tmp_path.name}_ck", "copy_ck"])
    strided = json.loads((multi / "copy_ck" / "eval.json").read_text())
    assert strided["mode"] == "strided" and strided["stride"] == 16 and strided["data_seed"] == 7
    assert strided["window_order"] == "contiguous" and rec["window_order"] == "shuffled"
    assert rec["data_seed"] == rec["seed"] == 1234
    assert [r["tokens"] for r in strided["results"]] == [256, 256]
    # a strided evaluation says so, in the console and in eval.md's header (it is not comparable with the above)
    assert "strided evaluation, stride 16" in (multi / "copy_ck" / "eval.md").read_text().splitlines()[0]
    assert proc.stdout.count("strided evaluation, stride 16") == 4  # per checkpoint: its first line and its table

    # only the long documents: recorded in eval.json; a threshold no document reaches is one clear error
    cmd = [sys.executable, os.path.join(ROOT, "evaluate.py"), "--checkpoint", ck, "--lengths", "32",
           "--max-tokens", "512", "--quiet"]
    proc = subprocess.run(cmd + ["--min-doc-tokens", "1", "--out", str(tmp_path / "long")],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    long_docs = json.loads((tmp_path / "long" / "eval.json").read_text())
    assert long_docs["min_doc_tokens"] == 1 and rec["min_doc_tokens"] is None
    assert long_docs["perplexity"]["32"] == rec["perplexity"]["32"]  # every document is >= 1 token: the same windows
    proc = subprocess.run(cmd + ["--min-doc-tokens", "1000000000", "--out", str(tmp_path / "none")],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode != 0 and "no document of 1000000000 tokens or more" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_evaluate_cli_errors(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "evaluate.py"), "--checkpoint", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "no `latest` file" in proc.stderr
