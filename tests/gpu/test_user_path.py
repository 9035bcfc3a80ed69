"""The user's path on one GPU, end to end, as the README and docs/ tell it: deepy.py + DeepSpeed bf16 on
the paper's config, SIGKILL and exact resume (dropout 0 and 0.1: the CUDA RNG state is saved and
restored), evaluate.py on CUDA far past the train length, generate.py with the kv-cache on CUDA,
and the HF export of a GPU-trained checkpoint. Skipped without CUDA; `make test-gpu` runs them.

Every child process gets an environment without the suite's DS_ACCELERATOR=cpu pin
(tests/conftest.py), so `auto` means the GPU as it does for a user."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from megatron.process.distributed import free_port
from tests.conftest import ROOT, train_config_dict, write_token_dataset, write_yaml
from tests.integration.fault_helpers import child_env, last_iteration, train_losses

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
ITERS = 10


def gpu_env() -> dict:
    env = child_env(accelerator=None)
    env.pop("TRITON_INTERPRET", None)
    env["HF_HUB_OFFLINE"] = "1"
    return env


def run(*argv, timeout=300) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *argv], cwd=ROOT, env=gpu_env(), capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    return proc


def start_train(config: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "train.py", config], cwd=ROOT, env=gpu_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_token_dataset(str(tmp_path_factory.mktemp("gpu_data") / "tiny_text_document"), num_docs=3000)


def tiny_gpu_config(tmp_path, corpus, name, **over) -> tuple[str, str, str]:
    """(config path, checkpoint dir, run dir) of a tiny CUDA run that saves every 2 steps."""
    ck, run_dir = str(tmp_path / f"{name}_ck"), str(tmp_path / name)
    over = {"train_iters": ITERS, "save": ck, "load": ck, "save_interval": 2, "run_dir": run_dir, "device": "cuda",
            **over}
    data = train_config_dict(tmp_path, corpus, **over)
    return write_yaml(tmp_path / f"{name}.yml", data), ck, run_dir


@pytest.fixture(scope="module")
def gpu_checkpoint(tmp_path_factory, corpus):
    """A tiny kerple_log model trained on the GPU (fp32), for evaluate/generate/export."""
    tmp = tmp_path_factory.mktemp("gpu_ckpt")
    config, ck, _ = tiny_gpu_config(tmp, corpus, "trained", train_iters=6)
    out = run("train.py", config).stdout
    assert "device cuda:" in out and "process group nccl" in out
    return ck


def test_paper_config_trains_in_bf16_through_deepy(tmp_path, corpus):
    """The paper's 162M config as shipped (bf16 via the 2022 `fp16: {type: bfloat16}` spelling,
    DeepSpeed, pipe-parallel-size 1), a few steps on a local corpus; saves and validates."""
    ck = str(tmp_path / "ck")
    exp = write_yaml(tmp_path / "exp.yml", {
        "data-path": corpus, "tokenizer-type": "CharLevelTokenizer", "padded-vocab-size": 128,
        "train-iters": 4, "save": ck, "load": ck, "save-interval": 4, "eval-interval": 4, "eval-iters": 1,
        "log-interval": 1, "run-dir": str(tmp_path / "run"), "num-workers": 0,
        "train_micro_batch_size_per_gpu": 8, "seq-length-val": 1024, "split": "80,10,10"})
    proc = run("deepy.py", "train.py", "configs/paper/train.yml", exp, "-o", f"master-port={free_port()}", timeout=540)
    out = proc.stdout + proc.stderr
    assert "device cuda:0" in out and "process group nccl" in out and "MFU against" in out, out[-3000:]
    rows = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    train = [r for r in rows if r["kind"] == "train"]
    assert [r["iteration"] for r in train] == [1, 2, 3, 4]
    assert all(r["lm_loss"] == r["lm_loss"] and 0 < r["mfu"] < 1 for r in train)  # finite, MFU logged
    assert open(os.path.join(ck, "latest")).read().strip() == "global_step4"


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_sigkill_then_resume_is_exact_on_cuda(tmp_path, corpus, dropout):
    """Dropout on CUDA draws from the CUDA generator: the resumed losses equal the uninterrupted
    run's only if its state is saved and restored. (1e-5: cuBLAS and the embedding's backward
    accumulate in an order that may differ between processes.)"""
    over = {"hidden_dropout": dropout, "attention_dropout": dropout}
    ref_cfg, _, ref_run = tiny_gpu_config(tmp_path, corpus, "reference", **over)
    out, _ = start_train(ref_cfg).communicate(timeout=300)
    reference = train_losses(ref_run)
    assert sorted(reference) == list(range(1, ITERS + 1)), out[-3000:]
    cfg, _, run_dir = tiny_gpu_config(tmp_path, corpus, "killed", **over)
    proc = start_train(cfg)
    deadline = time.time() + 240
    while last_iteration(run_dir) < 5 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    resumed = start_train(cfg)
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0 and "[checkpoint] loaded" in out, out[-3000:]
    got = train_losses(run_dir)
    assert sorted(got) == list(range(1, ITERS + 1))
    for it, loss in got.items():
        assert loss == pytest.approx(reference[it], abs=1e-5), (it, loss, reference[it])


def test_evaluate_on_cuda_far_past_the_train_length(tmp_path, gpu_checkpoint):
    out = tmp_path / "eval"
    proc = run("evaluate.py", "--checkpoint", gpu_checkpoint, "--lengths", "32,1024,8192", "--max-tokens", "16384",
               "--out", str(out), "--quiet")
    assert "evaluate.py: device cuda:0" in proc.stderr  # --device auto on a GPU machine
    record = json.load(open(out / "eval.json"))
    assert record["device"] == "cuda:0"
    ppl = {r["length"]: r["ppl"] for r in record["results"]}
    assert set(ppl) == {32, 1024, 8192} and all(0 < p < 1e4 for p in ppl.values()), ppl


def test_generate_with_the_kv_cache_on_cuda(gpu_checkpoint):
    from megatron.checkpoint.load_model import load_checkpoint_model

    model, _, _ = load_checkpoint_model(gpu_checkpoint, device="cuda")
    tokens = torch.randint(1, 100, (2, 40), device="cuda")
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache()
        steps = [model(tokens[:, :8], cache=cache)] + [model(tokens[:, i:i + 1], cache=cache) for i in range(8, 40)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-4, atol=1e-4)
    proc = run("generate.py", "--checkpoint", gpu_checkpoint, "--prompt", "abc", "--max-new-tokens", "64", "--greedy")
    assert "generate.py: device cuda:0" in proc.stderr and "[generate] 64 tokens" in proc.stdout + proc.stderr


def test_hf_export_of_a_gpu_trained_checkpoint(tmp_path, gpu_checkpoint):
    transformers = pytest.importorskip("transformers")
    from megatron.checkpoint.load_model import load_checkpoint_model

    run("tools/export_hf.py", "--checkpoint", gpu_checkpoint, "--out", str(tmp_path / "hf"))
    ours, _, _ = load_checkpoint_model(gpu_checkpoint, device="cpu")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), trust_remote_code=True,
                                                           dtype=torch.float32).eval()
    tokens = torch.randint(1, 100, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, ours(tokens), rtol=0, atol=1e-4)
