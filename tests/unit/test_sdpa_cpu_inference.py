"""SDPA's CPU inference route (megatron/attention/sdpa.py): a mask built from its diagonals, 4-D
for torch's fused kernel, queries in chunks against the keys they can see. Checked against the
paper's formula written here and against the reference backend; training keeps the dense path."""
import math

import pytest
import torch

import megatron.attention.sdpa as sdpa
from megatron.attention import resolve_backend
from megatron.model import GPTModel
from megatron.positional.base import PositionalSpec
from megatron.positional.registry import build_scheme

H, D = 4, 8
SPEC = PositionalSpec(num_heads=H, head_dim=D, hidden_size=H * D, max_position_embeddings=64)
# (Lq, Lk, q0 - k0, window): full rows, kv-cache rows, one new token, sliding windows
CASES = [(37, 37, 0, None), (37, 37, 0, 5), (3, 37, 34, None), (3, 37, 34, 7), (1, 37, 36, 1), (20, 20, 0, 64)]


def kerple_log(seed=0):
    torch.manual_seed(seed)
    return build_scheme("kerple_log", SPEC)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"Lq{c[0]}-Lk{c[1]}-off{c[2]}-W{c[3]}")
def test_the_mask_is_the_papers_bias_plus_the_causal_window_mask(case):
    """KERPLE-log (Chi et al. 2022, eq. for the log variant): bias_h(i, j) = -p_h log(1 + a_h (i - j))
    where key j is visible (0 <= i - j < W), -inf elsewhere; written here element by element."""
    lq, lk, offset, window = case
    scheme = kerple_log()
    p, a = scheme.bias_p.detach().flatten().tolist(), scheme.bias_a.detach().flatten().tolist()
    with torch.no_grad():
        prepared = sdpa.SDPAAttention().prepare(scheme, torch.arange(lq) + offset, torch.arange(lk), window)
    assert prepared.mask.shape == (1, H, lq, lk)  # 4-D: torch's fused CPU kernel
    mask = prepared.mask[0].flip(-1)  # its keys run last to first
    expected = torch.full((H, lq, lk), float("-inf"))
    for h in range(H):
        for i in range(lq):
            for j in range(lk):
                d = offset + i - j
                if d >= 0 and (window is None or d < window):
                    expected[h, i, j] = -p[h] * math.log(1 + a[h] * d)
    torch.testing.assert_close(mask, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"Lq{c[0]}-Lk{c[1]}-off{c[2]}-W{c[3]}")
@pytest.mark.parametrize("name", ["kerple_log", "alibi", "rpe", "none"])
def test_chunked_inference_matches_the_reference_backend(monkeypatch, name, case):
    """With chunks of 8 rows (several per case), every scheme SDPA runs, windows and kv-cache
    rows; `none` without a window keeps is_causal=True."""
    monkeypatch.setattr(sdpa, "QUERY_CHUNK", 8)
    lq, lk, offset, window = case
    torch.manual_seed(1)
    scheme = build_scheme(name, SPEC)
    q, k, v = torch.randn(2, H, lq, D), torch.randn(2, H, lk, D), torch.randn(2, H, lk, D)
    q_pos, k_pos = torch.arange(lq) + offset, torch.arange(lk)
    with torch.no_grad():
        prepared = sdpa.SDPAAttention().prepare(scheme, q_pos, k_pos, window)
        out = sdpa.SDPAAttention().forward(q, k, v, scheme, q_pos, k_pos, window, prepared=prepared)
        ref = resolve_backend("reference", scheme, "cpu", torch.float32, False).forward(
            q, k, v, scheme, q_pos, k_pos, window)
    plain = name == "none" and window is None and lq == lk
    assert (prepared.mask is None) == plain
    assert plain or len(prepared.chunks) == -(-lq // 8)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def test_training_keeps_the_dense_mask_and_one_call():
    """Autograd on: the 3-D mask (SDPA's math path, the gradient to the scheme's parameters) of
    before, so training figures stay bit for bit."""
    scheme = kerple_log()
    pos = torch.arange(16)
    prepared = sdpa.SDPAAttention().prepare(scheme, pos, pos)
    assert prepared.mask.shape == (H, 16, 16) and prepared.chunks is None and prepared.mask.requires_grad
    with torch.no_grad():
        assert torch.equal(sdpa.SDPAAttention().prepare(scheme, pos, pos).mask[0].flip(-1), prepared.mask.detach())


def test_gapped_positions_keep_the_dense_mask():
    scheme = kerple_log()
    pos = torch.arange(16) * 2
    with torch.no_grad():
        prepared = sdpa.SDPAAttention().prepare(scheme, pos, pos)
    assert prepared.mask.shape == (H, 16, 16) and prepared.chunks is None


def test_auto_resolves_sdpa_for_kerple_log_cpu_inference_at_2048_and_4096():
    """The choice docs/benchmarks.md measured: SDPA's inference route, with no compile, at least
    as fast per call as compiled flex (which auto took from 4,096 before) from 4,096 tokens."""
    def pick(tokens, training=False):
        return resolve_backend("auto", kerple_log(), "cpu", torch.float32, training, tokens=tokens).name

    assert pick(2048) == pick(4096) == pick(4096, training=True) == "sdpa"


def test_eval_logits_at_2048_tokens_match_the_reference_backend(tiny_config, monkeypatch):
    """The model `auto` runs at 2,048 tokens on CPU (chunked SDPA) against the reference backend:
    max |logit difference| 1e-5 (logits of order 1; fp32 rounding of a different summation)."""
    tokens = torch.randint(0, 128, (1, 2048), generator=torch.Generator().manual_seed(0))
    built = []
    original = sdpa.diagonal_mask
    monkeypatch.setattr(sdpa, "diagonal_mask", lambda *a: built.append(a) or original(*a))
    logits = {}
    for backend in ("auto", "reference"):
        cfg = tiny_config(pos_emb="kerple_log", num_layers=2, attention_backend=backend,
                          seq_length=2048, max_position_embeddings=2048).model
        torch.manual_seed(0)
        model = GPTModel(cfg, 128).eval()
        with torch.no_grad():
            logits[backend] = model(tokens)
        assert len(built) == 1  # auto took SDPA's inference route once (reference: none)
    torch.testing.assert_close(logits["auto"], logits["reference"], rtol=0, atol=1e-5)
