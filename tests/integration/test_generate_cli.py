"""generate.py: greedy, sampling (temperature / top-k / top-p), prompt file, interactive input,
kv-cache on, tokens/s printed; and the sampling filters on their own."""
import os
import subprocess
import sys

import pytest
import torch

from megatron.config import load_config
from tests.conftest import ROOT, train_config_dict, write_token_dataset, write_yaml


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from megatron.training.trainer import Trainer

    tmp = tmp_path_factory.mktemp("gen")
    data = write_token_dataset(str(tmp / "tiny_text_document"))
    ck = str(tmp / "ck")
    conf = train_config_dict(tmp, data, train_iters=3, save=ck, save_interval=3)
    Trainer(load_config([write_yaml(tmp / "t.yml", conf)])).train()
    return ck


def _run(args, stdin=None):
    return subprocess.run([sys.executable, os.path.join(ROOT, "generate.py"), *args], input=stdin,
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_greedy_prompt_and_prompt_file(trained, tmp_path):
    from megatron.checkpoint.load_model import load_checkpoint_model
    from megatron.generation import generate_tokens

    proc = _run(["--checkpoint", trained, "--prompt", "abc", "--greedy", "--max-new-tokens", "8"])
    assert proc.returncode == 0, proc.stderr
    assert "tokens/s" in proc.stderr and "kv-cache on" in proc.stderr
    model, _, _ = load_checkpoint_model(trained)
    new = generate_tokens(model, list(b"abc"), 8, greedy=True, vocab_limit=512)
    assert proc.stdout.splitlines()[0] == "abc" + bytes(i for i in new if i < 256).decode("utf-8", "replace")

    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n\nworld\n")
    args = ["--checkpoint", trained, "--prompt-file", str(prompts), "--temperature", "0.7", "--top-k", "20",
            "--top-p", "0.9", "--max-new-tokens", "6", "--seed", "3"]
    a, b = _run(args), _run(args)
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout and a.stderr.count("tokens/s") == 2  # seeded sampling repeats


def test_interactive_and_errors(trained, tmp_path):
    proc = _run(["--checkpoint", trained, "--interactive", "--max-new-tokens", "4"], stdin="one\ntwo\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("tokens/s") == 2
    missing = _run(["--checkpoint", str(tmp_path), "--prompt", "x"])
    assert missing.returncode == 2 and "no `latest` file" in missing.stderr
    bad = _run(["--checkpoint", trained, "--prompt", "x", "--top-p", "0"])
    assert bad.returncode == 2 and "--top-p" in bad.stderr


def test_filters():
    from megatron.generation import filter_logits

    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    assert torch.isinf(filter_logits(logits, top_k=2)[0, 2:]).all()
    assert not torch.isinf(filter_logits(logits, top_k=2)[0, :2]).any()
    probs = logits.softmax(-1)[0]  # ~0.64, 0.24, 0.09, ...
    kept = ~torch.isinf(filter_logits(logits, top_p=0.8)[0])
    assert kept.tolist() == [True, True, False, False, False] and probs[:2].sum() >= 0.8
    torch.testing.assert_close(filter_logits(logits, temperature=2.0), logits / 2)


def test_a_request_beyond_memory_is_refused_at_once(trained):
    """Issue 23: --max-new-tokens 1000000000000 ran until memory ran out; its kv-cache needs more
    than any machine here has, so it is refused before the first token, saying what fits."""
    proc = _run(["--checkpoint", trained, "--prompt", "abc", "--max-new-tokens", str(10**12)])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "--max-new-tokens 1000000000000: the kv-cache" in proc.stderr and "new tokens fit" in proc.stderr
    assert proc.stdout == ""
