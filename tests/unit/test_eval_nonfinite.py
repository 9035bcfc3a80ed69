"""Issue 23: a NaN/inf token loss was averaged into the result (xPos past its fp32 range gave
662 NaN losses and exit 0). evaluate.py now refuses it: one message naming the length and the
window, a non-zero exit, and no eval.json. The model is real; its losses are poisoned at one
window (as an overflowing scheme would make them)."""
import sys

import pytest

from megatron import errors
from megatron.checkpoint import load_model as load_mod
from megatron.evaluation import sweep as evaluate
from megatron.model import GPTModel
from tests.conftest import checkpoint_layout


@pytest.fixture
def poisoned(tiny_config, token_dataset, monkeypatch):
    cfg = tiny_config(data_path=token_dataset, split="80,10,10")
    model = GPTModel(cfg.model, 128).eval()
    clean, calls = model.token_losses, []

    def token_losses(x, y, **kw):
        out = clean(x, y, **kw)
        calls.append(1)
        if len(calls) == 2:  # the second window
            out[0, -3] = float("inf")  # scored in both modes (strided scores a window's last targets)
            out[0, -1] = float("nan")
        return out

    model.token_losses = token_losses
    monkeypatch.setattr(load_mod, "load_checkpoint_model", lambda *a, **k: (model, cfg, {"iteration": 4}))
    monkeypatch.delenv(errors.DEBUG_ENV, raising=False)


@pytest.mark.parametrize("mode,where", [([], "window 2 of"),
                                        (["--stride", "8", "--max-tokens", "64"], "strided window 2 (targets")])
def test_nonfinite_loss_is_refused_naming_length_and_window(tmp_path, poisoned, monkeypatch, capsys, mode, where):
    out = tmp_path / "eval"
    monkeypatch.setattr(sys, "argv", ["evaluate.py", "--checkpoint", checkpoint_layout(tmp_path / "ck"), "--lengths", "16",
                                      "--max-windows", "4", "--out", str(out), "--quiet", *mode])
    with pytest.raises(SystemExit) as e:
        errors.run_cli(evaluate.main, "evaluate.py", expected=(ValueError,))
    assert e.value.code == errors.EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error:") == 1
    assert "length 16" in err and where in err and "2 token losses are not finite" in err and "position 13" in err
    assert "--lengths" in err  # the fix
    assert not (out / "eval.json").exists()


def test_harness_scores_refuse_nonfinite_outputs(tiny_config):
    """The lm-eval adapter's scoring: a NaN hidden state is refused, not ranked among the choices."""
    import torch

    from megatron.evaluation.harness.batching import score_continuations
    from megatron.evaluation.lengths import NonFiniteLoss

    model = GPTModel(tiny_config().model, 128).eval()
    requests = [([1, 2, 3, 4], [5]), ([1, 2], [3, 4])]
    assert all(isinstance(ll, float) for ll, _ in score_continuations(model, requests))
    clean = model.hidden_states
    model.hidden_states = lambda tokens, *a, **k: clean(tokens) * torch.tensor(float("nan"))
    with pytest.raises(NonFiniteLoss, match="up to 4 tokens.*--max-length"):
        score_continuations(model, requests, batch_size=2)
