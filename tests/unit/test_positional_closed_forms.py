"""Every positional scheme against an independent closed form (plain python loops over i, j),
plus the properties the model relies on: shift invariance, TP slicing, parameter domains,
finite gradients at distance 0, stats() keys and the registry's names."""
import math

import pytest
import torch

from megatron.positional.base import PositionalSpec
from megatron.positional.registry import build_scheme, scheme_names

H, HEAD_DIM, HIDDEN, MAX_POS = 4, 8, 16, 32
EPS = 1e-2
PAPER_NAMES = ["learned", "sinusoidal", "rotary", "rpe", "alibi", "none", "kerple_log",
               "kerple_power_ap_", "kerple_power__ap", "kerple_power_ap_ap",
               "kerple_power_original", "kerple_log_3para"]
SCORE_SCHEMES = ["rpe", "alibi", "kerple_log", "kerple_power_ap_", "kerple_power__ap",
                 "kerple_power_ap_ap", "kerple_power_original", "kerple_log_3para", "sandwich"]
POWER = ["kerple_power_ap_", "kerple_power__ap", "kerple_power_ap_ap"]


def make_spec(**kw):
    base = dict(num_heads=H, head_dim=HEAD_DIM, hidden_size=HIDDEN, max_position_embeddings=MAX_POS)
    base.update(kw)
    return PositionalSpec(**base)


def build(name, seed=0, **kw):
    torch.manual_seed(seed)
    return build_scheme(name, make_spec(**kw))


def heads(param):
    return [float(x) for x in param.detach().flatten()]


def positions(lq=5, lk=7, offset=0):
    """kv-cache shaped: the queries are the last lq of lk positions."""
    k_pos = torch.arange(lk) + offset
    return k_pos[lk - lq:], k_pos


def assert_matches(got, expected_fn, q_pos, k_pos, rtol=1e-5, atol=1e-6):
    """got: (H, Lq, Lk); expected_fn(h, i, j) -> float, compared on the causal part (j <= i)."""
    got = got.detach()
    assert torch.isfinite(got).all()
    for h in range(got.shape[0]):
        for qi, i in enumerate(q_pos.tolist()):
            for kj, j in enumerate(k_pos.tolist()):
                if j <= i:
                    assert math.isclose(float(got[h, qi, kj]), expected_fn(h, i, j),
                                        rel_tol=rtol, abs_tol=atol), (h, i, j)


# ---------------------------------------------------------------- registry


def test_registry_lists_every_paper_scheme():
    names = scheme_names()
    missing = [n for n in PAPER_NAMES if n not in names]
    assert not missing, missing


def test_unknown_scheme_is_a_value_error():
    with pytest.raises(ValueError, match="unknown pos-emb"):
        build_scheme("kerple_cubic", make_spec())


# ---------------------------------------------------------------- closed forms of the biases


def test_kerple_log_closed_form():
    s = build("kerple_log")
    p, a = heads(s.bias_p), heads(s.bias_a)
    q_pos, k_pos = positions()
    assert_matches(s.score_bias(q_pos, k_pos),
                   lambda h, i, j: -max(p[h], EPS) * math.log(1 + max(a[h], EPS) * (i - j)),
                   q_pos, k_pos)
    assert s.score_weight(q_pos, k_pos) is None


def _power(d, p):
    return 0.0 if d == 0 else d ** p


@pytest.mark.parametrize("name", POWER)
def test_kerple_power_closed_form(name):
    s = build(name)
    q_pos, k_pos = positions()
    bias, weight = s.score_bias(q_pos, k_pos), s.score_weight(q_pos, k_pos)
    has_bias, has_weight = name != "kerple_power__ap", name != "kerple_power_ap_"
    assert (bias is not None) == has_bias and (weight is not None) == has_weight
    if has_bias:
        p = [min(max(x, EPS), 2.0) for x in heads(s.bias_p)]
        a = [max(x, EPS) for x in heads(s.bias_a)]
        assert_matches(bias, lambda h, i, j: -a[h] * _power(i - j, p[h]), q_pos, k_pos)
    if has_weight:
        pw = [min(max(x, EPS), 2.0) for x in heads(s.wei_p)]
        aw = [max(x, EPS) for x in heads(s.wei_a)]
        assert_matches(weight, lambda h, i, j: math.exp(-aw[h] * _power(i - j, pw[h])), q_pos, k_pos)


def test_kerple_power_exponent_above_two_is_clamped():
    s = build("kerple_power_ap_")
    with torch.no_grad():
        s.bias_p.fill_(5.0)
    a = [max(x, EPS) for x in heads(s.bias_a)]
    q_pos, k_pos = positions()
    assert_matches(s.score_bias(q_pos, k_pos), lambda h, i, j: -a[h] * (i - j) ** 2, q_pos, k_pos)


SLOPES_8 = [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256]
SLOPES_12 = SLOPES_8 + [2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5]


@pytest.mark.parametrize("n_heads,expected", [(8, SLOPES_8), (12, SLOPES_12)])
def test_alibi_closed_form(n_heads, expected):
    s = build("alibi", num_heads=n_heads)
    assert heads(s.slopes) == pytest.approx(expected, rel=1e-6)
    q_pos, k_pos = positions()
    assert_matches(s.score_bias(q_pos, k_pos), lambda h, i, j: -expected[h] * (i - j), q_pos, k_pos)


@pytest.mark.parametrize("n_heads,expected", [(8, SLOPES_8), (12, SLOPES_12)])
def test_kerple_power_original_is_clamped_alibi(n_heads, expected):
    s = build("kerple_power_original", num_heads=n_heads)
    assert not s.bias_a.requires_grad
    assert s.bias_p is None and s.wei_p is None and s.wei_a is None
    q_pos, k_pos = positions()
    # 2^-7 and 2^-8 are below 0.01 and get raised: the paper's "original" is not exact ALiBi.
    assert_matches(s.score_bias(q_pos, k_pos), lambda h, i, j: -max(expected[h], EPS) * (i - j),
                   q_pos, k_pos)


def test_kerple_log_3para_closed_form():
    s = build("kerple_log_3para")
    assert heads(s.bias_r) == [1.0] * H  # starts as kerple_log
    with torch.no_grad():
        s.bias_r.copy_(torch.tensor([0.5, 1.5, 2.5, -1.0])[:, None, None])
    p, a = heads(s.bias_p), heads(s.bias_a)
    r = [0.5, 1.5, 2.0, EPS]  # r3 clamped into [0.01, 2]
    q_pos, k_pos = positions()
    assert_matches(s.score_bias(q_pos, k_pos),
                   lambda h, i, j: -max(p[h], EPS) * math.log(1 + max(a[h], EPS) * _power(i - j, r[h])),
                   q_pos, k_pos)


def test_kerple_log_3para_starts_as_kerple_log():
    q_pos, k_pos = positions()
    torch.testing.assert_close(build("kerple_log_3para").score_bias(q_pos, k_pos),
                               build("kerple_log").score_bias(q_pos, k_pos))


# distance -> bucket for 32 buckets, max_distance 128 (max_exact 16), computed by hand:
# 16 + floor(ln(n/16) / ln(8) * 16), capped at 31.
T5_BUCKETS = {0: 0, 5: 5, 15: 15, 16: 16, 20: 17, 32: 21, 64: 26, 100: 30, 127: 31, 128: 31, 500: 31}


def test_t5_buckets_and_bias():
    s = build("rpe")
    assert tuple(s.weight.shape) == (32, H)
    dists = list(T5_BUCKETS)
    q_pos, k_pos = torch.tensor(dists), torch.tensor([0])
    bias = s.score_bias(q_pos, k_pos).detach()  # (H, len(dists), 1)
    w = s.weight.detach()
    for qi, n in enumerate(dists):
        for h in range(H):
            expected = float(w[T5_BUCKETS[n], h]) * math.sqrt(HEAD_DIM)
            assert math.isclose(float(bias[h, qi, 0]), expected, rel_tol=1e-6), n
    # Above the diagonal the distance is clamped to 0, i.e. bucket 0 (masked anyway).
    up = s.score_bias(torch.tensor([0]), torch.tensor([3]))
    torch.testing.assert_close(up[:, 0, 0], w[0] * math.sqrt(HEAD_DIM))


# ---------------------------------------------------------------- absolute schemes


def test_sinusoidal_closed_form():
    s = build("sinusoidal")
    pos = torch.tensor([0, 1, 7, 300])
    emb = s.embed(pos)
    assert tuple(emb.shape) == (4, HIDDEN)
    half = HIDDEN // 2
    for r, t in enumerate(pos.tolist()):
        for c in range(HIDDEN):
            f = 1.0 / 10000 ** (2 * (c % half) / HIDDEN)
            expected = math.sin(t * f) if c < half else math.cos(t * f)
            assert math.isclose(float(emb[r, c]), expected, abs_tol=2e-5), (t, c)
    assert "inv_freq" in s.state_dict()


def _complex_rotate(x, t, nd, base=10000.0):
    """x: list of D floats. Pairs (c, c + nd/2) rotate as complex numbers by t * base^(-2c/nd)."""
    out = list(x)
    for c in range(nd // 2):
        z = complex(x[c], x[c + nd // 2]) * complex(math.cos(t * base ** (-2 * c / nd)),
                                                     math.sin(t * base ** (-2 * c / nd)))
        out[c], out[c + nd // 2] = z.real, z.imag
    return out


@pytest.mark.parametrize("pct", [1.0, 0.5])
def test_rotary_against_complex_rotation(pct):
    s = build("rotary", options={"rotary_pct": pct})
    nd = int(HEAD_DIM * pct)
    torch.manual_seed(1)
    q_pos, k_pos = positions(lq=2, lk=6, offset=40)  # kv-cache rows at an offset
    q, k = torch.randn(1, H, 2, HEAD_DIM), torch.randn(1, H, 6, HEAD_DIM)
    qr, kr = s.rotate_qk(q, k, q_pos, k_pos)
    for x, xr, pos in ((q, qr, q_pos), (k, kr, k_pos)):
        for h in range(H):
            for r, t in enumerate(pos.tolist()):
                expected = _complex_rotate(x[0, h, r].tolist(), t, nd)
                assert xr[0, h, r].tolist() == pytest.approx(expected, abs=1e-4)


def test_rotary_scores_are_shift_invariant():
    s = build("rotary")
    torch.manual_seed(2)
    q, k = torch.randn(1, H, 4, HEAD_DIM), torch.randn(1, H, 4, HEAD_DIM)

    def scores(offset):
        pos = torch.arange(4) + offset
        qr, kr = s.rotate_qk(q, k, pos, pos)
        return qr @ kr.transpose(-1, -2)  # (1, H, 4, 4)

    torch.testing.assert_close(scores(0), scores(1000), atol=1e-3, rtol=1e-3)


def test_learned_closed_form_and_limit():
    s = build("learned")
    assert tuple(s.weight.shape) == (MAX_POS, HIDDEN) and list(s.state_dict()) == ["weight"]
    assert abs(s.weight.std().item() - 0.02) < 0.004
    pos = torch.tensor([0, 3, MAX_POS - 1])
    torch.testing.assert_close(s.embed(pos), s.weight[pos])
    assert not s.extrapolates and s.max_length() == MAX_POS
    with pytest.raises(ValueError, match="max-position-embeddings"):
        s.embed(torch.arange(MAX_POS + 1))


def test_none_has_no_signal():
    s = build("none")
    pos = torch.arange(3)
    q, k = torch.randn(1, H, 3, HEAD_DIM), torch.randn(1, H, 3, HEAD_DIM)
    assert s.embed(pos) is None and s.score_bias(pos, pos) is None and s.score_weight(pos, pos) is None
    qr, kr = s.rotate_qk(q, k, pos, pos)
    assert qr is q and kr is k


# ---------------------------------------------------------------- properties


def _kernels(s, q_pos, k_pos):
    return [x for x in (s.score_bias(q_pos, k_pos), s.score_weight(q_pos, k_pos)) if x is not None]


@pytest.mark.parametrize("name", SCORE_SCHEMES)
def test_shift_invariance(name):
    s = build(name)
    q_pos, k_pos = positions()
    for a, b in zip(_kernels(s, q_pos, k_pos), _kernels(s, q_pos + 1000, k_pos + 1000)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", PAPER_NAMES)
def test_tp_rank_holds_its_heads(name):
    full, half = build(name), build(name, tp_size=2, tp_rank=1)
    q_pos, k_pos = positions()
    for a, b in zip(_kernels(full, q_pos, k_pos), _kernels(half, q_pos, k_pos)):
        torch.testing.assert_close(b, a[H // 2:])
    sd_full = full.state_dict()
    for key, value in half.state_dict().items():
        ref = sd_full[key]
        if key == "weight" and name == "rpe":
            ref = ref[:, H // 2:]  # (buckets, H): heads are columns
        elif ref.dim() == 3:
            ref = ref[H // 2:]  # (H, 1, 1)
        torch.testing.assert_close(value, ref, msg=key)


def test_parameter_domain_clamp_is_forward_only():
    s = build("kerple_log")
    with torch.no_grad():
        s.bias_p.fill_(-1.0)
    q_pos, k_pos = positions()
    a = [max(x, EPS) for x in heads(s.bias_a)]
    bias = s.score_bias(q_pos, k_pos)
    assert_matches(bias, lambda h, i, j: -EPS * math.log(1 + a[h] * (i - j)), q_pos, k_pos)
    assert (s.bias_p.data == -1.0).all()  # the stored value is not mutated
    bias.sum().backward()
    assert s.bias_p.grad is not None and (s.bias_p.grad.abs() > 0).all()  # straight-through
    assert s.stats()["bias_p_min"] == pytest.approx(EPS)


@pytest.mark.parametrize("name", POWER + ["kerple_log_3para"])
def test_no_nan_gradient_at_distance_zero(name):
    s = build(name)
    with torch.no_grad():
        for p in s.parameters():
            p.fill_(0.3)  # small exponents make d^p steep near 0
    pos = torch.arange(5)
    loss = sum(x.sum() for x in _kernels(s, pos, pos))
    loss.backward()
    for n, p in s.named_parameters():
        assert torch.isfinite(p.grad).all(), n


@pytest.mark.parametrize("name,keys", [
    ("kerple_log", ["bias_p", "bias_a"]),
    ("kerple_power_ap_", ["bias_p", "bias_a"]),
    ("kerple_power__ap", ["wei_p", "wei_a"]),
    ("kerple_power_ap_ap", ["bias_p", "bias_a", "wei_p", "wei_a"]),
    ("kerple_power_original", ["bias_a"]),
    ("kerple_log_3para", ["bias_p", "bias_a", "bias_r"]),
])
def test_kerple_stats_keys(name, keys):
    stats = build(name).stats()
    assert set(stats) == {f"{k}_{s}" for k in keys for s in ("mean", "std", "max", "min")}
    assert all(isinstance(v, float) for v in stats.values())
    assert stats[f"{keys[0]}_min"] <= stats[f"{keys[0]}_mean"] <= stats[f"{keys[0]}_max"]
