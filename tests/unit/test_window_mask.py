"""The causal / sliding-window mask: keys i-W < j <= i (W keys, itself included)."""
import math

import pytest
import torch

from megatron.attention import allowed_mask, backend_names, resolve_backend
from megatron.positional.base import PositionalSpec
from megatron.positional.registry import build_scheme


def as_lists(mask):
    return mask.to(torch.int64).tolist()


def test_causal():
    pos = torch.arange(4)
    assert as_lists(allowed_mask(pos, pos)) == [[1, 0, 0, 0],
                                               [1, 1, 0, 0],
                                               [1, 1, 1, 0],
                                               [1, 1, 1, 1]]


def test_window_two():
    pos = torch.arange(5)
    assert as_lists(allowed_mask(pos, pos, window=2)) == [[1, 0, 0, 0, 0],
                                                         [1, 1, 0, 0, 0],
                                                         [0, 1, 1, 0, 0],
                                                         [0, 0, 1, 1, 0],
                                                         [0, 0, 0, 1, 1]]


def test_window_with_kv_cache_rows():
    k_pos = torch.arange(6)
    q_pos = k_pos[4:]  # the two newest tokens attend to the whole cache
    assert as_lists(allowed_mask(q_pos, k_pos, window=3)) == [[0, 0, 1, 1, 1, 0],
                                                             [0, 0, 0, 1, 1, 1]]
    assert as_lists(allowed_mask(q_pos, k_pos)) == [[1, 1, 1, 1, 1, 0],
                                                   [1, 1, 1, 1, 1, 1]]


def test_window_one_is_the_diagonal():
    pos = torch.arange(4) + 100
    assert torch.equal(allowed_mask(pos, pos, window=1), torch.eye(4, dtype=torch.bool))
    k_pos = torch.arange(5)
    assert as_lists(allowed_mask(k_pos[3:], k_pos, window=1)) == [[0, 0, 0, 1, 0],
                                                                  [0, 0, 0, 0, 1]]


def test_window_larger_than_sequence_is_causal():
    pos = torch.arange(6)
    assert torch.equal(allowed_mask(pos, pos, window=100), allowed_mask(pos, pos))


@pytest.mark.parametrize("window", [0, -3, 2.5, True])
def test_invalid_window(window):
    pos = torch.arange(3)
    with pytest.raises(ValueError, match="window"):
        allowed_mask(pos, pos, window=window)


def _windowed_by_loop(q, k, v, p, a, q_pos, k_pos, window):
    """Each row attends softmax over only its last `window` keys, with the kerple_log bias."""
    B, H, Lq, D = q.shape
    out = torch.zeros_like(q, dtype=torch.float64)
    keys = k_pos.tolist()
    for qi, i in enumerate(q_pos.tolist()):
        cols = [c for c, j in enumerate(keys) if i - window < j <= i]
        for b in range(B):
            for h in range(H):
                logits = torch.tensor([
                    float(q[b, h, qi] @ k[b, h, c]) / math.sqrt(D)
                    - p[h] * math.log(1 + a[h] * (i - keys[c])) for c in cols], dtype=torch.float64)
                w = torch.softmax(logits, dim=0)
                out[b, h, qi] = sum(w[n] * v[b, h, c].double() for n, c in enumerate(cols))
    return out


@pytest.mark.parametrize("backend_name", ["reference", "sdpa"])
@pytest.mark.parametrize("lq", [7, 3])
def test_windowed_attention_equals_last_w_keys(backend_name, lq):
    assert backend_name in backend_names()
    torch.manual_seed(0)
    scheme = build_scheme("kerple_log", PositionalSpec(num_heads=2, head_dim=4, hidden_size=8,
                                                       max_position_embeddings=16))
    backend = resolve_backend(backend_name, scheme, torch.device("cpu"), torch.float32, True)
    k_pos = torch.arange(7) + 10
    q_pos = k_pos[7 - lq:]
    q, k, v = torch.randn(2, 2, lq, 4), torch.randn(2, 2, 7, 4), torch.randn(2, 2, 7, 4)
    p = [float(x) for x in scheme.bias_p.detach().clamp_min(0.01).flatten()]
    a = [float(x) for x in scheme.bias_a.detach().clamp_min(0.01).flatten()]
    with torch.no_grad():
        got = backend.forward(q, k, v, scheme, q_pos, k_pos, window=3)
    expected = _windowed_by_loop(q, k, v, p, a, q_pos, k_pos, window=3)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
