"""Blockwise causal attention (Sun et al. 2022, section 3.3) for evaluation: the block-by-block
kv-cache computation equals full-sequence attention under the paper's mask, written here."""
from __future__ import annotations

import pytest
import torch

import megatron.attention.reference as reference
from megatron.evaluation.blockwise import blockwise_causal_losses, check_block
from megatron.model import GPTModel


def paper_mask(block):
    """Blocks of `block` tokens; a query attends to its own block (causally) and the previous one."""
    def allowed(q_pos, k_pos, window=None, row_starts=None, doc_starts=None, first_key=0):
        assert row_starts is None and doc_starts is None and first_key == 0
        i, j = q_pos[:, None], k_pos[None, :]
        return (j <= i) & (j // block >= i // block - 1)
    return allowed


@pytest.mark.parametrize("pos", ["xpos", "rotary", "kerple_log"])
@pytest.mark.parametrize("block,length", [(8, 45), (5, 40)])
def test_equals_full_attention_under_the_papers_mask(tiny_config, monkeypatch, pos, block, length):
    torch.manual_seed(0)
    model = GPTModel(tiny_config(pos_emb=pos, attention_backend="reference").model, 128).eval()
    tokens, labels = torch.randint(0, 128, (2, length)), torch.randint(0, 128, (2, length))
    got = blockwise_causal_losses(model, tokens, labels, block)
    full = model.token_losses(tokens, labels)
    with monkeypatch.context() as m:
        m.setattr(reference, "allowed_mask", paper_mask(block))
        want = model.token_losses(tokens, labels)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (got - full)[:, 2 * block:].abs().max() > 1e-6  # beyond two blocks it is not full attention
    torch.testing.assert_close(got[:, :2 * block], full[:, :2 * block], rtol=1e-5, atol=1e-5)


def test_block_defaults_to_half_the_train_length_and_refuses_a_window(tiny_config):
    assert check_block(0, 512) == 256 and check_block(100, 512) == 100
    with pytest.raises(ValueError, match="positive"):
        check_block(-3, 512)
    model = GPTModel(tiny_config(pos_emb="xpos", attention_window=4).model, 128).eval()
    with pytest.raises(ValueError, match="attention-window"):
        blockwise_causal_losses(model, torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 8, dtype=torch.long), 4)


def test_negative_block_size_is_argparse_error(tmp_path, capsys):
    from megatron.evaluation import sweep as evaluate

    with pytest.raises(SystemExit) as e:
        evaluate.main(["--checkpoint", str(tmp_path), "--out", str(tmp_path / "out"), "--blockwise-causal", "-3"])
    assert e.value.code == 2
    assert "--blockwise-causal: must be an integer >= 0" in capsys.readouterr().err


@pytest.mark.parametrize("extra,msg", [(["--blockwise-causal", "--stride", "4"], "drop --stride"),
                                       (["--blockwise-causal", "8", "--window", "4"], "drop --stride / --window")])
def test_evaluate_flag_refusals(tmp_path, extra, msg):
    from megatron.errors import UserError
    from megatron.evaluation import sweep as evaluate

    with pytest.raises(UserError, match=msg):
        evaluate.main(["--checkpoint", str(tmp_path), "--out", str(tmp_path / "out"), *extra])
