"""RoPE scaling (rotary-scaling: linear | ntk | dynamic | yarn | llama3) against the papers' formulas written here,
against HF transformers' own rope-init functions, on a model (kv-cache, checkpoint loading, 64k
positions), and its bad values refused naming the key."""
from __future__ import annotations

import math

import pytest
import torch

from megatron.config import ConfigError
from megatron.model import GPTModel
from megatron.positional.base import PositionalSpec
from megatron.positional.registry import build_scheme

BASE, L = 10000, 64


def _rotary(dim, kind, factor, beta_fast=32.0, beta_slow=1.0, pct=1.0, **options):
    spec = PositionalSpec(num_heads=1, head_dim=int(dim / pct), hidden_size=int(dim / pct), max_position_embeddings=L,
                          options={"rotary_pct": pct, "rotary_emb_base": BASE, "seq_length": L,
                                   "rotary_scaling": kind, "rotary_scaling_factor": factor,
                                   "rotary_yarn_beta_fast": beta_fast, "rotary_yarn_beta_slow": beta_slow, **options})
    return build_scheme("rotary", spec)


def _theta(dim, base=BASE):
    return torch.tensor([base ** (-2 * i / dim) for i in range(dim // 2)], dtype=torch.float64)


# ---- the papers' formulas ---------------------------------------------------------------------
@pytest.mark.parametrize("dim", [8, 16, 64])
@pytest.mark.parametrize("s", [2.0, 16.0])
def test_linear_is_position_interpolation(dim, s):
    """Chen et al. 2023: f'(x, m) = f(x, m / s), i.e. every frequency divided by s."""
    got = _rotary(dim, "linear", s)._inv_freq("cpu").double()
    torch.testing.assert_close(got, _theta(dim) / s, rtol=1e-6, atol=0)


@pytest.mark.parametrize("dim", [8, 16, 64])
@pytest.mark.parametrize("s", [2.0, 16.0])
def test_ntk_changes_the_base(dim, s):
    """bloc97: base' = base * s^(d / (d - 2)); the highest frequency is kept, the lowest divided by s."""
    got = _rotary(dim, "ntk", s)._inv_freq("cpu").double()
    torch.testing.assert_close(got, _theta(dim, BASE * s ** (dim / (dim - 2))), rtol=1e-5, atol=0)
    assert got[0] == 1.0 and math.isclose(got[-1] * s, _theta(dim)[-1], rel_tol=1e-5)


def _yarn_paper(dim, s, alpha, beta):
    """Peng et al. 2023, eq. 17-18, with the ramp over the dimension index between the (floored,
    ceiled) indices where r(d) = L / lambda_d equals beta and alpha (the authors' released code)."""
    theta = _theta(dim)
    index_at = [dim * math.log(L / (r * 2 * math.pi)) / (2 * math.log(BASE)) for r in (beta, alpha)]
    lo, hi = max(math.floor(index_at[0]), 0), min(math.ceil(index_at[1]), dim - 1)
    out = []
    for i, t in enumerate(theta.tolist()):
        gamma = min(max((i - lo) / (hi - lo), 0.0), 1.0) if hi != lo else float(i >= hi)
        out.append((1 - gamma) * t + gamma * t / s)  # gamma 0: keep theta (extrapolate), 1: theta / s
    return torch.tensor(out, dtype=torch.float64), 0.1 * math.log(s) + 1


@pytest.mark.parametrize("dim", [16, 64, 128])
@pytest.mark.parametrize("s,beta_fast,beta_slow", [(4.0, 32.0, 1.0), (16.0, 16.0, 2.0)])
def test_yarn_frequencies_and_temperature(dim, s, beta_fast, beta_slow):
    scheme = _rotary(dim, "yarn", s, beta_fast, beta_slow)
    want, mscale = _yarn_paper(dim, s, beta_slow, beta_fast)
    got = scheme._inv_freq("cpu").double()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=0)
    # the paper's regions: dims turning > beta times over L keep theta, < alpha times get theta / s
    rotations = L * _theta(dim) / (2 * math.pi)
    keep, interp = rotations > beta_fast * 2, rotations < beta_slow / 2
    torch.testing.assert_close(got[keep], _theta(dim)[keep], rtol=1e-6, atol=0)
    torch.testing.assert_close(got[interp], _theta(dim)[interp] / s, rtol=1e-6, atol=0)
    assert math.isclose(scheme.scaling.attention_factor(), mscale)


def _llama3_reference(dim, s, low, high, length=L):
    """Meta's Llama 3.1 `apply_scaling` (llama/model.py), frequency by frequency in float64."""
    out = []
    for t in _theta(dim).tolist():
        wavelen = 2 * math.pi / t
        if wavelen < length / high:
            out.append(t)
        elif wavelen > length / low:
            out.append(t / s)
        else:
            smooth = (length / wavelen - low) / (high - low)
            out.append((1 - smooth) * t / s + smooth * t)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("dim", [16, 64, 128])
@pytest.mark.parametrize("s,low,high", [(8.0, 1.0, 4.0), (32.0, 2.0, 16.0)])
def test_llama3_keeps_short_wavelengths_divides_long_ones_and_blends_between(dim, s, low, high):
    got = _rotary(dim, "llama3", s, rotary_llama3_low_freq_factor=low, rotary_llama3_high_freq_factor=high)
    want = _llama3_reference(dim, s, low, high)
    torch.testing.assert_close(got._inv_freq("cpu").double(), want, rtol=1e-6, atol=0)
    wavelen = 2 * math.pi / _theta(dim)
    assert bool(((wavelen < L / high) | (wavelen > L / low)).any())  # both plain bands are exercised
    assert got.scaling.attention_factor() == 1.0


@pytest.mark.parametrize("dim", [8, 64])
def test_dynamic_is_ntk_at_the_call_length_and_nothing_up_to_the_original(dim):
    """Dynamic NTK (emozilla): s' = s * n / L - (s - 1) for n > L, the trained frequencies up to L."""
    s, scheme = 3.0, _rotary(dim, "dynamic", 3.0)
    for n in (1, L // 2, L):
        assert torch.equal(scheme._inv_freq("cpu", torch.tensor(n)), scheme.inv_freq)  # the trained ones
    for n in (L + 1, 2 * L, 10 * L):
        s_n = s * n / L - (s - 1)
        torch.testing.assert_close(scheme._inv_freq("cpu", torch.tensor(n)).double(),
                                   _theta(dim, BASE * s_n ** (dim / (dim - 2))), rtol=1e-5, atol=0)


def test_dynamic_takes_the_length_from_the_call_positions():
    """The full-sequence call of n tokens uses n; a kv-cache call (its new rows only) the sequence so far."""
    dim, scheme = 16, _rotary(16, "dynamic", 4.0)
    q = torch.randn(1, 1, 3 * L, dim)
    full, _ = scheme.rotate_qk(q, q, torch.arange(3 * L), torch.arange(3 * L))
    last, _ = scheme.rotate_qk(q[:, :, -1:], q[:, :, -1:], torch.tensor([3 * L - 1]), torch.tensor([3 * L - 1]))
    torch.testing.assert_close(last, full[:, :, -1:], rtol=0, atol=0)
    theta = scheme._inv_freq("cpu", torch.tensor(3 * L)).double()
    torch.testing.assert_close(full[0, 0].double(), _rotate_half_reference(q[0, 0], torch.arange(3 * L), theta),
                               rtol=0, atol=2e-4)
    shorter, _ = scheme.rotate_qk(q[:, :, :2 * L], q[:, :, :2 * L], torch.arange(2 * L), torch.arange(2 * L))
    assert (shorter[:, :, -1] - full[:, :, 2 * L - 1]).abs().max() > 1e-3  # another length, other frequencies


def _rotate_half_reference(x, pos, theta):
    """x (L, d) rotated in the rotate-half layout at positions pos with frequencies theta."""
    ang = pos.double()[:, None] * theta[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    x1, x2 = x.double().chunk(2, -1)
    return x.double() * cos + torch.cat([-x2, x1], -1) * sin


@pytest.mark.parametrize("kind", ["linear", "ntk", "yarn"])
def test_rotation_uses_the_scaled_frequencies_and_yarn_scales_q_and_k(kind):
    dim, s = 16, 8.0
    scheme = _rotary(dim, kind, s)
    pos = torch.arange(0, 2048, 37)  # fp32 angles: ~1e-7 * pos * theta rounding
    q, k = torch.randn(1, 1, len(pos), dim), torch.randn(1, 1, len(pos), dim)
    rq, rk = scheme.rotate_qk(q, k, pos, pos)
    theta = {"linear": _theta(dim) / s, "ntk": _theta(dim, BASE * s ** (dim / (dim - 2))),
             "yarn": _yarn_paper(dim, s, 1.0, 32.0)[0]}[kind]
    m = 0.1 * math.log(s) + 1 if kind == "yarn" else 1.0
    torch.testing.assert_close(rq[0, 0].double(), m * _rotate_half_reference(q[0, 0], pos, theta), rtol=0, atol=2e-3)
    torch.testing.assert_close(rk[0, 0].double(), m * _rotate_half_reference(k[0, 0], pos, theta), rtol=0, atol=2e-3)


# ---- HF transformers' own functions -----------------------------------------------------------
def _hf(rope_type, dim, pct, seq_len=None, **params):
    """(inv_freq, attention factor) from transformers' ROPE_INIT_FUNCTIONS for a Llama config with
    head_dim = dim / pct (2 heads) and rope_parameters {rope_type, rope_theta, ...params}."""
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = transformers.LlamaConfig(hidden_size=int(dim / pct) * 2, num_attention_heads=2, max_position_embeddings=L,
                                   rope_parameters={"rope_type": rope_type, "rope_theta": float(BASE),
                                                    "partial_rotary_factor": pct, **params})
    return ROPE_INIT_FUNCTIONS[rope_type](cfg, "cpu", seq_len=seq_len)


@pytest.mark.parametrize("dim,pct", [(16, 1.0), (32, 0.5), (64, 1.0)])
@pytest.mark.parametrize("s", [2.0, 16.0])
def test_equal_to_transformers_rope_init(dim, pct, s):
    linear, _ = _hf("linear", dim, pct, factor=s)
    torch.testing.assert_close(_rotary(dim, "linear", s, pct=pct)._inv_freq("cpu"), linear, rtol=1e-6, atol=0)
    # HF's dynamic NTK base is base * (f * len / L - (f - 1))^(d/(d-2)): at len = 2 L with
    # f = s - 1 that is our static base * s^(d/(d-2))
    ntk, _ = _hf("dynamic", dim, pct, seq_len=2 * L, factor=s - 1)
    torch.testing.assert_close(_rotary(dim, "ntk", s, pct=pct)._inv_freq("cpu"), ntk, rtol=1e-5, atol=0)
    yarn, factor = _hf("yarn", dim, pct, factor=s, original_max_position_embeddings=L, beta_fast=32.0, beta_slow=1.0)
    ours = _rotary(dim, "yarn", s, pct=pct)
    torch.testing.assert_close(ours._inv_freq("cpu"), yarn, rtol=1e-6, atol=0)
    assert math.isclose(ours.scaling.attention_factor(), factor)
    for n in (L, 2 * L, 7 * L + 3):  # dynamic: transformers' own length-dependent frequencies, bit for bit
        dynamic, _ = _hf("dynamic", dim, pct, seq_len=torch.tensor(n), factor=s)
        torch.testing.assert_close(_rotary(dim, "dynamic", s, pct=pct)._inv_freq("cpu", torch.tensor(n)), dynamic,
                                   rtol=0, atol=0)
    llama3, _ = _hf("llama3", dim, pct, factor=s, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=L)
    torch.testing.assert_close(_rotary(dim, "llama3", s, pct=pct)._inv_freq("cpu"), llama3, rtol=0, atol=0)


# ---- on a model -------------------------------------------------------------------------------
def _decode(model, tokens, chunks):
    cache, out, start = model.new_cache(), [], 0
    for n in chunks:
        out.append(model(tokens[:, start:start + n], cache=cache))
        start += n
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("kind", ["linear", "ntk", "yarn", "llama3"])
def test_kv_cache_equals_full_sequence_and_checkpoints_load(tiny_config, kind):
    torch.manual_seed(0)
    plain = GPTModel(tiny_config(pos_emb="rotary").model, 128).eval()
    scaled = GPTModel(tiny_config(pos_emb="rotary", rotary_scaling=kind, rotary_scaling_factor=4.0).model, 128).eval()
    scaled.load_state_dict(plain.state_dict())  # a checkpoint trained without scaling loads unchanged (strict)
    tokens = torch.randint(0, 128, (2, 70))  # beyond the train length 32
    with torch.no_grad():
        full = scaled(tokens)
        torch.testing.assert_close(_decode(scaled, tokens, [40] + [1] * 10 + [20]), full, rtol=1e-5, atol=1e-5)
        assert (full - plain(tokens)).abs().max() > 1e-4  # the option is in effect (random weights: small logits)
    assert torch.equal(scaled.position.inv_freq, plain.position.inv_freq)


def test_original_length_defaults_to_the_train_length(tiny_config):
    cfg = tiny_config(pos_emb="rotary", rotary_scaling="yarn", rotary_scaling_factor=4.0)
    assert cfg.model.rotary_scaling_original_length == 32
    assert GPTModel(cfg.model, 128).position.scaling.original_length == 32


def test_finite_at_64k_positions_fp32_and_bf16():
    scheme = _rotary(64, "yarn", 16.0)
    pos = torch.arange(65536)
    for dtype in (torch.float32, torch.bfloat16):
        q = torch.randn(1, 1, len(pos), 64, dtype=dtype)
        rq, rk = scheme.rotate_qk(q, q, pos, pos)
        assert rq.dtype == dtype and bool(rq.isfinite().all()) and bool(rk.isfinite().all())


@pytest.mark.parametrize("over,key", [
    ({"rotary_scaling": "longrope"}, "rotary-scaling"),
    ({"rotary_scaling": "llama3", "rotary_llama3_low_freq_factor": 4.0, "rotary_llama3_high_freq_factor": 4.0},
     "rotary-llama3-high-freq-factor"),
    ({"rotary_scaling": "yarn", "rotary_scaling_factor": 0.5}, "rotary-scaling-factor"),
    ({"rotary_scaling": "yarn", "rotary_yarn_beta_fast": 1.0, "rotary_yarn_beta_slow": 2.0}, "rotary-yarn-beta-fast"),
    ({"rotary_scaling": "linear", "rotary_scaling_original_length": 0}, "rotary-scaling-original-length"),
    ({"pos_emb": "kerple_log", "rotary_scaling": "yarn"}, "rotary-scaling"),
])
def test_bad_values_name_the_key(tiny_config, over, key):
    over = {"pos_emb": "rotary", **over}
    with pytest.raises(ConfigError) as e:
        tiny_config(**over)
    assert key in str(e.value)
