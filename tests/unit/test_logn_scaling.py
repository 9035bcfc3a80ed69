"""attention-logn-scaling (Su, kexue.fm/archives/8823; Qwen's logn-attn): the per-query factor
against the formula written here, its placement (it multiplies q.k/sqrt(d) before the bias), every
backend against the reference with it on (forward and backward, the scheme's parameters included,
fp32 and bf16), kv-cache decoding, and its config errors."""
import math

import pytest
import torch

from megatron.config import ConfigError, load_config
from megatron.model import GPTModel
from megatron.positional.distance import causal_distance
from tests.conftest import KERNEL_DEVICE

TRAIN = 8  # seq-length: the tiny models below run past it, where the factor is > 1


def qwen_factor(pos: int, train: int, window=None, everywhere=False) -> float:
    """Qwen's table, logn[i] = log_L(i) if i > L else 1 for i = 1.., indexed by position + 1 keys
    (min with the window); Su's article: log_L(n) for every n."""
    n = pos + 1 if window is None else min(pos + 1, window)
    if everywhere:
        return math.log(n) / math.log(train)
    return math.log(n, train) if n > train else 1.0


def model(tiny_config, seed=0, **over):
    torch.manual_seed(seed)
    over = {"seq_length": TRAIN, "attention_logn_scaling": True, **over}
    m = GPTModel(tiny_config(**over).model, 128)
    with torch.no_grad():  # sharper attention than the init's, so the factor visibly matters
        for name, p in m.named_parameters():
            if name.endswith("query_key_value.weight"):
                p.mul_(8)
    return m


@pytest.mark.parametrize("window,everywhere", [(None, False), (5, False), (None, True), (12, True)])
def test_factor_matches_the_formula(tiny_config, window, everywhere):
    scheme = model(tiny_config, attention_window=window, attention_logn_everywhere=everywhere).position
    q_pos = torch.tensor([0, 1, 7, 8, 9, 100, 65535])
    got = scheme.query_scale(q_pos, window)
    want = torch.tensor([qwen_factor(p, TRAIN, window, everywhere) for p in q_pos.tolist()])
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    assert torch.isfinite(got).all() and got.max() < 6  # log(65536) / log(8) = 5.33


def test_off_by_default(tiny_config):
    torch.manual_seed(0)
    scheme = GPTModel(tiny_config().model, 128).position
    assert scheme.query_scale(torch.arange(100)) is None


def test_scales_q_dot_k_before_the_bias(tiny_config):
    """One attention layer by hand: softmax(s_i * q.k/sqrt(D) + kerple_log bias) @ v."""
    from megatron.model.attention import AttentionContext

    m = model(tiny_config, pos_emb="kerple_log", attention_backend="reference").eval()
    attn = m.layers[0].attention
    L, heads, D = 20, 4, 8
    x = torch.randn(1, L, 32)
    pos = torch.arange(L)
    with torch.no_grad():
        q, k, v = attn.query_key_value(x).view(1, L, heads, 3 * D).transpose(1, 2).chunk(3, dim=-1)
        s = torch.tensor([qwen_factor(p, TRAIN) for p in range(L)])
        r1, r2 = (m.position.clamped()[n].reshape(-1, 1, 1) for n in ("bias_p", "bias_a"))
        d = causal_distance(pos, pos)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(D) * s[:, None] - r1 * torch.log1p(r2 * d)
        scores = scores.masked_fill(pos[:, None] < pos[None, :], float("-inf"))
        want = attn.dense((torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(1, L, -1))
        got = attn(x, AttentionContext.build(m.model_cfg, m.position, {}, x.device, x.dtype, False, pos))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _loss_and_grads(m, tokens):
    logits = m(tokens)
    loss = logits.float().square().mean()
    params = [p for p in m.parameters() if p.requires_grad]
    return logits.detach().float(), torch.autograd.grad(loss, params)


def _backends():
    names = ["sdpa"]
    try:
        import triton  # noqa: F401
        names.append(pytest.param("triton", marks=pytest.mark.gpu))  # compiled on a GPU: make test-gpu
    except ImportError:
        pass
    return names


@pytest.mark.parametrize("pos", ["kerple_log", "sandwich", "rotary"])
@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)], ids=["fp32", "bf16"])
def test_backends_agree_with_logn_on(tiny_config, pos, backend, dtype, tol):
    """Logits and every parameter gradient (the positional parameters included) at 3x the
    training length, where the factor reaches log(24)/log(8) = 1.53. In bf16 the reference itself
    is off the fp32 result by up to ~4.5% on its worst tensor (kerple_log, sandwich, rotary, seeds
    0-3: 1.4-4.5e-2), so a bf16 backend is judged as FlashAttention's tests judge theirs: its worst
    error against the fp32 reference within twice the bf16 reference's (measured: at most 1.5x)."""
    device = KERNEL_DEVICE if backend == "triton" else torch.device("cpu")  # the kernel's device here
    tokens = torch.randint(0, 128, (2, 3 * TRAIN), generator=torch.Generator().manual_seed(1)).to(device)
    want = _loss_and_grads(model(tiny_config, pos_emb=pos, attention_backend="reference").to(device, dtype), tokens)
    got = _loss_and_grads(model(tiny_config, pos_emb=pos, attention_backend=backend).to(device, dtype), tokens)

    def worst(xs, ys):
        return max(float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6))
                   for a, b in zip((xs[0], *xs[1]), (ys[0], *ys[1])))

    if dtype == torch.float32:
        err, allowed = worst(got, want), tol
    else:
        exact = _loss_and_grads(model(tiny_config, pos_emb=pos, attention_backend="reference").to(device), tokens)
        err, allowed = worst(got, exact), 2 * worst(want, exact)
    assert err <= allowed, f"{pos} {backend} {dtype}: relative error {err:.2e} (allowed {allowed:.2e})"
    off = model(tiny_config, pos_emb=pos, attention_backend="reference", attention_logn_scaling=False).to(device, dtype)
    with torch.no_grad():  # the factor changes the logits past seq-length, not before
        change = (off(tokens).float() - want[0]).abs().amax(dim=(0, 2))
    assert change[:TRAIN].max() <= tol * want[0].abs().max() and change[TRAIN:].mean() > 1e-2 * want[0].abs().max()


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_agrees_with_logn_on(tiny_config, monkeypatch):
    from megatron.attention.flex import FlexAttention

    monkeypatch.setattr(FlexAttention, "eager_on_cpu", True)  # CPU flex is inference; eager: no compile
    tokens = torch.randint(0, 128, (1, 3 * TRAIN))
    with torch.no_grad():
        want = model(tiny_config, pos_emb="sandwich", attention_backend="reference").eval()(tokens)
        got = model(tiny_config, pos_emb="sandwich", attention_backend="flex").eval()(tokens)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("pos,window", [("kerple_log", None), ("sandwich", 5), ("rotary", None)])
def test_kv_cache_decoding_equals_the_full_sequence(tiny_config, pos, window):
    m = model(tiny_config, pos_emb=pos, attention_window=window).eval()
    tokens = torch.randint(0, 128, (2, 3 * TRAIN))
    with torch.no_grad():
        full = m(tokens)
        cache, steps = m.new_cache(), []
        for start, n in ((0, 6), *((6 + i, 1) for i in range(3 * TRAIN - 6))):
            steps.append(m(tokens[:, start:start + n], cache=cache))
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)


def _config_problem(tmp_path, extra: str) -> str:
    path = tmp_path / "bad.yml"
    path.write_text("num-layers: 2\nhidden-size: 32\nnum-attention-heads: 4\ntrain-iters: 3\n" + extra)
    with pytest.raises(ConfigError) as e:
        load_config([str(path)])
    return str(e.value)


def test_bad_values_name_the_key(tmp_path):
    err = _config_problem(tmp_path, "seq-length: 1\nattention-logn-scaling: true\n")
    assert "attention-logn-scaling" in err and "seq-length >= 2" in err
    err = _config_problem(tmp_path, "seq-length: 8\nattention-logn-everywhere: true\n")
    assert "attention-logn-everywhere" in err and "attention-logn-scaling: true" in err
    err = _config_problem(tmp_path, "seq-length: 8\nattention-logn-scaling: maybe\n")
    assert "attention-logn-scaling" in err
