"""xPos (Sun et al. 2022) against the paper's score written here, at short lengths and at 64k
positions (finite in fp32 and bf16), in the regime where a lone zeta^-n would overflow, through
the backends and the kv-cache, and its bad values refused naming the key."""
from __future__ import annotations

import math

import pytest
import torch

from megatron.config import ConfigError
from megatron.model import GPTModel
from megatron.positional.base import PositionalSpec
from megatron.positional.registry import build_scheme

BASE = 10000


def _xpos(dim, scale_base=512.0, gamma=0.4):
    spec = PositionalSpec(num_heads=1, head_dim=dim, hidden_size=dim, max_position_embeddings=64,
                          options={"rotary_emb_base": BASE, "xpos_scale_base": scale_base, "xpos_gamma": gamma})
    return build_scheme("xpos", spec)


def _paper_scores(q, k, m, n, dim, scale_base, gamma):
    """Paper eq. (section 3.2): for rotary pair i, the complex q_i * conj(k_i) turned by (m-n) theta_i
    and decayed by zeta_i^((m-n)/scale_base), zeta_i = (i/(d/2) + gamma)/(1 + gamma); summed over i.
    q, k: (Lq, d), (Lk, d) in the rotate-half layout (pair i = dims i and i + d/2). float64."""
    half = dim // 2
    zq = torch.complex(q[:, :half].double(), q[:, half:].double())  # (Lq, d/2)
    zk = torch.complex(k[:, :half].double(), k[:, half:].double())
    theta = torch.tensor([BASE ** (-2 * i / dim) for i in range(half)], dtype=torch.float64)
    zeta = torch.tensor([(i / half + gamma) / (1 + gamma) for i in range(half)], dtype=torch.float64)
    rel = (m.double()[:, None] - n.double()[None, :])[..., None]  # (Lq, Lk, 1)
    turn = torch.exp(1j * rel * theta) * zeta ** (rel / scale_base)
    return (zq[:, None, :] * zk.conj()[None, :, :] * turn).real.sum(-1)  # (Lq, Lk)


def test_zeta_is_torchscales():
    """The paper's zeta with gamma 0.4 is torchscale's (arange(0, d, 2) + 0.4 d) / (1.4 d)."""
    d = 32
    ours = _xpos(d).log_zeta("cpu").exp()
    torch.testing.assert_close(ours, (torch.arange(0, d, 2) + 0.4 * d) / (1.4 * d))


@pytest.mark.parametrize("dim,scale_base,gamma", [(16, 512.0, 0.4), (8, 8.0, 0.4), (16, 32.0, 1.5)])
def test_scores_match_the_paper_and_are_shift_invariant(dim, scale_base, gamma):
    scheme = _xpos(dim, scale_base, gamma)
    torch.manual_seed(0)
    q, k = torch.randn(20, dim), torch.randn(20, dim)
    for shift in (0, 1000):
        pos = torch.arange(20) + shift
        rq, rk = scheme.rotate_qk(q[None, None], k[None, None], pos, pos)
        got = (rq[0, 0].double() @ rk[0, 0].double().T).tril()
        want = _paper_scores(q, k, pos, pos, dim, scale_base, gamma).tril()
        # fp32 angles at position ~1000 round by ~1e-4 rad (worst seen over 200 draws: 1.3e-4)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=5e-4)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-3), (torch.bfloat16, 1e-2)])
def test_finite_and_exact_at_64k_positions(dtype, tol):
    """Positions 0..65535 in one call: zeta^(-65535/512) alone would be exp(160) (inf in fp32 and
    bf16). Every rotated q and k is finite; the causal scores of the last queries against keys all
    over the range equal the paper's."""
    dim, L = 16, 65536
    scheme = _xpos(dim)
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, L, dim).to(dtype), torch.randn(1, 1, L, dim).to(dtype)
    pos = torch.arange(L)
    rq, rk = scheme.rotate_qk(q, k, pos, pos)
    assert rq.dtype == dtype and bool(rq.isfinite().all()) and bool(rk.isfinite().all())
    m, n = pos[-4:], torch.cat([pos[:4], pos[30000:30004], pos[-8:]])
    got = rq[0, 0, m].double() @ rk[0, 0, n].double().T  # (4, 16)
    want = _paper_scores(q[0, 0, m], k[0, 0, n], m, n, dim, 512.0, 0.4)
    causal = m[:, None] >= n[None, :]
    assert bool(got[causal].isfinite().all())
    # angles at 64k carry fp32 rounding (~1e-7 * 65536 rad): error relative to the largest score
    assert (got - want).abs()[causal].max() < tol * want.abs()[causal].max()
    assert want[0, :4].abs().max() < 1e-5  # the paper's decay: keys 65k tokens back count ~0 ...
    assert got[0, :4].abs().max() < 1e-5  # ... and so they do here, not inf * 0


def test_a_lone_factor_would_overflow():
    """The test above is the regime that matters: without the centre, k's factor at 64k is inf."""
    scheme = _xpos(16)
    assert math.isinf(torch.exp(-65535 / 512 * scheme.log_zeta("cpu")).max().item())


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_backends_agree_without_nans_where_products_overflow(tiny_config, backend):
    """scale base 2 over 256 tokens is the 64k regime in miniature (each factor up to e^80, the
    masked products beyond fp32): forward and backward stay finite, the backends agree."""
    torch.manual_seed(0)
    ref = GPTModel(tiny_config(pos_emb="xpos", xpos_scale_base=2.0, attention_backend="reference").model, 128)
    other = GPTModel(tiny_config(pos_emb="xpos", xpos_scale_base=2.0, attention_backend=backend).model, 128)
    other.load_state_dict(ref.state_dict())
    tokens = torch.randint(0, 128, (1, 257))
    losses = []
    for model in (ref, other):
        loss = model(tokens[:, :-1], labels=tokens[:, 1:], loss_mask=torch.ones(1, 256))
        loss.backward()
        assert loss.isfinite() and all(p.grad.isfinite().all() for p in model.parameters() if p.grad is not None)
        losses.append(loss.item())
    assert math.isclose(*losses, rel_tol=1e-5)


def test_kv_cache_in_the_overflow_regime(tiny_config):
    torch.manual_seed(0)
    model = GPTModel(tiny_config(pos_emb="xpos", xpos_scale_base=2.0).model, 128).eval()
    tokens = torch.randint(0, 128, (1, 200))
    with torch.no_grad():
        full = model(tokens)
        cache, out = model.new_cache(), []
        for s, e in [(0, 150), (150, 151), (151, 200)]:
            out.append(model(tokens[:, s:e], cache=cache))
    torch.testing.assert_close(torch.cat(out, 1), full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("over,key", [({"xpos_gamma": 0}, "xpos-gamma"), ({"xpos_scale_base": -1}, "xpos-scale-base"),
                                      ({"rotary_scaling": "yarn"}, "rotary-scaling")])
def test_bad_values_name_the_key(tiny_config, over, key):
    with pytest.raises(ConfigError) as e:
        tiny_config(pos_emb="xpos", **over)
    assert key in str(e.value)


def test_long_call_is_finite_and_exact(tiny_config):
    """Issue 23: with scale base 64 and gamma 0.2 one call's centred fp32 factors overflow past
    2*64*ln(FLT_MAX)/|ln zeta_0| = 6,338 positions, and a 7,000-token evaluation returned NaN
    losses. Now every loss is finite and equals a float64 evaluation (whose range holds the whole
    call in one block)."""
    torch.manual_seed(0)
    model = GPTModel(tiny_config(pos_emb="xpos", xpos_scale_base=64.0, xpos_gamma=0.2).model, 128).eval()
    tokens = torch.randint(0, 128, (1, 7001))
    got = model.token_losses(tokens[:, :-1], tokens[:, 1:])
    assert bool(got.isfinite().all())
    # the paper's blockwise causal evaluation, blocks longer than one call's range (1,584) too
    from megatron.evaluation.blockwise import blockwise_causal_losses

    blocks = blockwise_causal_losses(model, tokens[:, :-1], tokens[:, 1:], 3000)
    assert bool(blocks.isfinite().all())
    model.double()
    want = model.token_losses(tokens[:, :-1], tokens[:, 1:])
    torch.testing.assert_close(got, want.float(), rtol=1e-4, atol=1e-4)
    want = blockwise_causal_losses(model, tokens[:, :-1], tokens[:, 1:], 3000)
    torch.testing.assert_close(blocks, want.float(), rtol=1e-4, atol=1e-4)
