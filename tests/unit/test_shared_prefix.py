"""A fork's rows read their shared past once (megatron/model/shared_prefix.py): the same hidden
states as each row's full sequence, for every scheme, grouped-query heads and a window; the shared
path is taken where it applies and the plain path elsewhere."""
import pytest
import torch

from megatron.config.model import ModelConfig
from megatron.model import GPTModel, attention
from megatron.positional.registry import scheme_names

ARCHS = {"mha": {}, "gqa": {"num_kv_heads": 2}, "window": {"attention_window": 7}}


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("scheme", scheme_names())
def test_fork_rows_equal_their_full_sequences(scheme, arch, monkeypatch):
    torch.manual_seed(0)
    cfg = ModelConfig(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, pos_emb=scheme,
                      max_position_embeddings=64, **ARCHS[arch])
    model = GPTModel(cfg, 50).eval()
    calls = []
    monkeypatch.setattr(attention, "shared_prefix_attention",
                        lambda *a, f=attention.shared_prefix_attention: calls.append(1) or f(*a))
    B, K, L, w = 2, 3, 20, 3
    prompt, cands = torch.randint(0, 50, (B, L)), torch.randint(0, 50, (B, K, w))
    with torch.no_grad():
        cache = model.new_cache()
        model.hidden_states(prompt, cache=cache)
        forked = model.hidden_states(cands.reshape(B * K, w), cache=cache.repeat_rows(K))
        full = model.hidden_states(torch.cat([prompt.repeat_interleave(K, 0), cands.reshape(B * K, w)], 1))[:, L:]
        after = model.hidden_states(cands[:, 0, :1], cache=cache)  # the forked-from cache is unchanged
        alone = model.hidden_states(torch.cat([prompt, cands[:, 0, :1]], 1))[:, L:]
    torch.testing.assert_close(forked, full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(after, alone, rtol=1e-5, atol=1e-5)
    late, weighted = model.position.rotate_after_cache, model.position.has_score_weight
    assert bool(calls) == (not late and not weighted), (scheme, arch, len(calls))
