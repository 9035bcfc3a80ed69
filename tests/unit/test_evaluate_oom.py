"""evaluate.py running out of memory at one length: one message naming the length and batch size
with the fix, and the lengths already evaluated kept on disk. No real OOM: evaluate_length is
patched to raise torch's OutOfMemoryError at the longest length."""
import json
import sys

import numpy as np
import pytest
import torch

from megatron import errors
from megatron.checkpoint import load_model as load_mod
from megatron.evaluation import lengths as lengths_mod
from megatron.evaluation import sweep as evaluate
from megatron.evaluation.lengths import LengthResult
from megatron.model import GPTModel
from tests.conftest import checkpoint_layout


@pytest.fixture
def patched(tmp_path, tiny_config, token_dataset, monkeypatch):
    cfg = tiny_config(data_path=token_dataset)
    model = GPTModel(cfg.model, 128).eval()
    monkeypatch.setattr(load_mod, "load_checkpoint_model", lambda *a, **k: (model, cfg, {"iteration": 4}))
    checkpoint_layout(tmp_path / "ck")
    calls = []

    def fake_evaluate_length(model, prefix, split, split_name, length, seed, max_windows, max_tokens,
                             batch_size=1, device="cpu", cache_dir=None, progress=True, window_order="shuffled",
                             blockwise_causal=None, min_doc_tokens=None, group=None):
        calls.append((length, batch_size))
        if length >= 128 and batch_size > 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")
        return LengthResult(length, 2.0, float(np.exp(2.0)), 2, 2 * length, 0.1, np.full(length, 2.0))

    monkeypatch.setattr(lengths_mod, "evaluate_length", fake_evaluate_length)
    return calls


def argv(tmp_path, batch: int) -> list[str]:
    return ["--checkpoint", str(tmp_path / "ck"), "--lengths", "32,64,128", "--batch-size", str(batch),
            "--out", str(tmp_path / "eval"), "--quiet"]


def test_oom_names_length_and_fix_and_keeps_finished_lengths(tmp_path, patched, monkeypatch, capsys):
    out = tmp_path / "eval"
    with pytest.raises(errors.OutOfMemory) as e:
        evaluate.main(argv(tmp_path, 4))
    msg = str(e.value)
    assert "length 128" in msg and "batch size 4" in msg
    assert "--batch-size 1" in msg and "--attention-backend flex" in msg
    partial = out / evaluate.PARTIAL
    assert str(partial) in msg and "32, 64" in msg
    rec = json.loads(partial.read_text())
    assert rec["lengths"] == [32, 64] and set(rec["perplexity"]) == {"32", "64"} and rec["incomplete"] is True
    assert not (out / "eval.json").exists()  # a partial result is never taken for a finished one

    # as a user sees it: one message, exit 1 (the machine, not the input), no traceback
    monkeypatch.delenv(errors.DEBUG_ENV, raising=False)
    monkeypatch.setattr(sys, "argv", ["evaluate.py", *argv(tmp_path, 4)])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        errors.run_cli(evaluate.main, "evaluate.py", expected=(ValueError,))
    assert exit_.value.code == errors.EXIT_SYSTEM_ERROR
    err = capsys.readouterr().err
    assert "evaluate.py: error: out of memory while evaluating length 128" in err and "Traceback" not in err

    # following the advice finishes the job; the partial file goes once eval.json has every length
    assert evaluate.main(argv(tmp_path, 1)) == 0
    assert json.loads((out / "eval.json").read_text())["lengths"] == [32, 64, 128]
    assert not partial.exists()
