"""The GPT model: the paper's 162M size, shapes, sharing of the positional scheme, loss."""
import os

import pytest
import torch

from megatron.config import load_config
from megatron.model import GPTModel, count_parameters

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_paper_162m_config_on_meta_device():
    paper = os.path.join(ROOT, "configs", "paper")
    cfg = load_config([os.path.join(paper, f) for f in ("local_setup.yml", "train.yml")])
    with torch.device("meta"):
        model = GPTModel(cfg.model, 50304)
    n = count_parameters(model)
    assert abs(n - 162_000_000) <= 1_000_000, n
    assert all(p.device.type == "meta" for p in model.parameters())


def test_forward_shapes_and_tied_output(tiny_config):
    model = GPTModel(tiny_config(no_weight_tying=False).model, 128)
    assert model.output_layer is None
    tokens = torch.randint(0, 128, (2, 16))
    assert model(tokens).shape == (2, 16, 128)
    untied = GPTModel(tiny_config().model, 128)
    assert count_parameters(untied) == count_parameters(model) + 128 * 32


def test_scheme_is_shared_once(tiny_config):
    model = GPTModel(tiny_config(pos_emb="kerple_log").model, 128)
    names = [n for n, _ in model.named_parameters() if "bias_p" in n]
    assert names == ["position.bias_p"]
    tokens = torch.randint(0, 128, (2, 16))
    model(tokens, labels=tokens).backward()
    assert model.position.bias_p.grad is not None and model.position.bias_p.grad.abs().sum() > 0


def test_loss_matches_masked_cross_entropy(tiny_config):
    torch.manual_seed(0)
    model = GPTModel(tiny_config().model, 128)
    tokens, labels = torch.randint(0, 128, (2, 16)), torch.randint(0, 128, (2, 16))
    mask = torch.ones(2, 16)
    mask[0, :5] = 0
    logits = model(tokens).float()
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none")
    expect = (ce * mask.flatten()).sum() / mask.sum()
    assert torch.allclose(model(tokens, labels=labels, loss_mask=mask), expect, atol=1e-5)
    chunked = model.token_losses(tokens, labels, chunk=5)
    assert torch.allclose(chunked.flatten(), ce, atol=1e-5)


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rotary", "rpe", "alibi", "none", "kerple_log",
                                 "kerple_power_ap_", "kerple_power_ap_ap", "kerple_log_3para"])
def test_every_scheme_builds_and_runs(tiny_config, pos):
    model = GPTModel(tiny_config(pos_emb=pos).model, 128)
    tokens = torch.randint(0, 128, (1, 16))
    loss = model(tokens, labels=tokens)
    loss.backward()
    assert torch.isfinite(loss)


def test_window_changes_output(tiny_config):
    torch.manual_seed(0)
    full = GPTModel(tiny_config().model, 128)
    windowed = GPTModel(tiny_config(attention_window=4).model, 128)
    windowed.load_state_dict(full.state_dict())
    tokens = torch.randint(0, 128, (1, 16))
    a, b = full(tokens), windowed(tokens)
    assert torch.allclose(a[:, :4], b[:, :4], atol=1e-5)  # first W positions see the same keys
    assert not torch.allclose(a[:, 8:], b[:, 8:], atol=1e-4)


def test_bf16_forward_close_to_fp32(tiny_config):
    torch.manual_seed(0)
    model = GPTModel(tiny_config().model, 128)
    tokens = torch.randint(0, 128, (2, 16))
    ref = model(tokens, labels=tokens)
    low = model.to(torch.bfloat16)(tokens, labels=tokens)
    assert low.dtype == torch.float32  # the loss is always computed from float32 logits
    assert abs(low.item() - ref.item()) < 5e-2


def test_activation_checkpointing_gives_the_same_gradients(tiny_config):
    torch.manual_seed(0)
    plain = GPTModel(tiny_config().model, 128)
    ckpt = GPTModel(tiny_config().model, 128, checkpoint_activations=True)
    ckpt.load_state_dict(plain.state_dict())
    tokens = torch.randint(0, 128, (2, 16))
    for m in (plain, ckpt):
        m.train()
        m(tokens, labels=tokens).backward()
    for (name, a), (_, b) in zip(plain.named_parameters(), ckpt.named_parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-6), name
