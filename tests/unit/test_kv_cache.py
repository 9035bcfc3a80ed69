"""kv-cache decoding: feeding a prompt then one token (or a chunk) at a time with a cache gives
the same logits as one forward over the whole sequence, for every registered scheme."""
import pytest
import torch

from megatron.model import GPTModel
from megatron.positional.registry import scheme_names
from tests.conftest import KERNEL_DEVICE


def _model(tiny_config, **over):
    torch.manual_seed(0)
    return GPTModel(tiny_config(**over).model, 128).eval()


def _decode(model, tokens, chunks):
    """Logits from feeding `tokens` in pieces of the given sizes through one cache."""
    cache, out, start = model.new_cache(), [], 0
    for n in chunks:
        out.append(model(tokens[:, start:start + n], cache=cache))
        start += n
    assert start == tokens.shape[1] and cache.length == start
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("pos", scheme_names())
@pytest.mark.parametrize("window", [None, 4])
def test_cached_steps_equal_full_sequence(tiny_config, pos, window):
    model = _model(tiny_config, pos_emb=pos, attention_window=window)
    tokens = torch.randint(0, 128, (2, 14))
    with torch.no_grad():
        full = model(tokens)
        steps = _decode(model, tokens, [5] + [1] * 9)  # prompt, then one token per step
        chunked = _decode(model, tokens, [3, 4, 7])  # several new tokens per step also work
    torch.testing.assert_close(steps, full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(chunked, full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pos", ["kerple_log", "rotary", "xpos"])
@pytest.mark.parametrize("kv_heads", [2, 1])
def test_grouped_query_cached_steps_equal_full_sequence(tiny_config, pos, kv_heads):
    """Grouped-query heads reach the backend unrepeated, from the cache (kv heads only) too;
    xpos rotates per query block after the cache (SelfAttention._attend)."""
    model = _model(tiny_config, pos_emb=pos, attention_window=4, num_kv_heads=kv_heads)
    tokens = torch.randint(0, 128, (2, 14))
    with torch.no_grad():
        full = model(tokens)
        steps = _decode(model, tokens, [5] + [1] * 9)
    torch.testing.assert_close(steps, full, rtol=1e-5, atol=1e-5)


def test_window_bounds_the_cache(tiny_config):
    model = _model(tiny_config, pos_emb="kerple_log", attention_window=4)
    cache = model.new_cache()
    with torch.no_grad():
        for t in torch.randint(0, 128, (1, 12)).unbind(1):
            model(t[:, None], cache=cache)
    assert cache.length == 12 and cache.positions.tolist() == [9, 10, 11]
    assert cache.kv[0][0].shape[2] == 3  # the next query (12) sees keys 9..12 only


def test_no_cache_path_unchanged(tiny_config):
    model = _model(tiny_config, pos_emb="rotary")
    tokens = torch.randint(0, 128, (1, 8))
    with torch.no_grad():
        assert torch.equal(model(tokens), model(tokens, positions=torch.arange(8)))


@pytest.mark.gpu
@pytest.mark.parametrize("pos", ["kerple_log", "kerple_power_ap_ap", "rpe", "sandwich"])
@pytest.mark.parametrize("window", [None, 4])
def test_cached_steps_on_the_fused_kernel(tiny_config, pos, window):
    """The Triton kernel (compiled on a GPU, the interpreter on CPU) decodes with a cache: q rows at
    the end of the keys."""
    pytest.importorskip("triton")
    model = _model(tiny_config, pos_emb=pos, attention_window=window, attention_backend="triton").to(KERNEL_DEVICE)
    reference = _model(tiny_config, pos_emb=pos, attention_window=window, attention_backend="reference").to(KERNEL_DEVICE)
    tokens = torch.randint(0, 128, (1, 10)).to(KERNEL_DEVICE)
    with torch.no_grad():
        full = reference(tokens)
        steps = _decode(model, tokens, [4] + [1] * 6)
    torch.testing.assert_close(steps, full, rtol=1e-5, atol=1e-5)


def test_fire_decoding_uses_the_absolute_query_position(tiny_config):
    """FIRE normalises by psi(max(L, i)), i the query's absolute position: with a small threshold L
    the logits change when the same tokens sit at other positions, so a decoder that fed the new
    token a wrong i would differ from the full forward."""
    model = _model(tiny_config, pos_emb="fire", fire_init_threshold=2.0)
    with torch.no_grad():
        for p in model.position.parameters():  # a larger bias, so position effects are visible
            p.mul_(3.0)
    tokens = torch.randint(0, 128, (2, 14))
    with torch.no_grad():
        full = model(tokens)
        shifted = model(tokens, positions=torch.arange(14) + 5)
        steps = _decode(model, tokens, [5] + [1] * 9)
    assert (shifted - full).abs().max() > 1e-3  # the query position matters
    torch.testing.assert_close(steps, full, rtol=1e-5, atol=1e-5)
