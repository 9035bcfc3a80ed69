"""Every attention backend against the reference backend, forward and backward (q, k, v and the
scheme's own parameters), and the reference backend against a naive loop."""
import logging
import math

import pytest
import torch

from megatron.attention import backend_names, resolve_backend
from megatron.positional.base import PositionalSpec
from megatron.positional.registry import build_scheme, scheme_names

CPU, F32 = torch.device("cpu"), torch.float32
B, H, D = 2, 4, 8
SPEC = PositionalSpec(num_heads=H, head_dim=D, hidden_size=H * D, max_position_embeddings=64)
# (Lq, Lk, offset, window): full rows, kv-cache rows, positions far from 0, sliding windows
CASES = [(9, 9, 0, None), (3, 9, 0, None), (9, 9, 1000, None), (9, 9, 0, 4), (3, 9, 50, 4)]


def scheme_for(name, seed=0):
    torch.manual_seed(seed)
    return build_scheme(name, SPEC)


def accepted_pairs():
    pairs = []
    for backend in backend_names():
        if backend == "reference":
            continue
        for name in scheme_names():
            try:
                resolve_backend(backend, scheme_for(name), CPU, F32, True)
            except ValueError:
                continue
            pairs.append((backend, name))
    return pairs


def run(backend, scheme, q, k, v, q_pos, k_pos, window, grad_out, repeat=1):
    """Forward like the model (rotate, then attend) and return out plus grads of q, k, v, params.
    `repeat`: hand the backend each key/value head repeated that many times (autograd then sums
    the grads of a head's copies), the plain reading of grouped-query attention."""
    q, k, v = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    qr, kr = scheme.rotate_qk(q, k, q_pos, k_pos)
    kr, vr = kr.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    out = backend.forward(qr, kr, vr, scheme, q_pos, k_pos, window=window)
    params = [p for p in scheme.parameters() if p.requires_grad]
    grads = torch.autograd.grad((out * grad_out).sum(), [q, k, v] + params, allow_unused=True)
    return out.detach(), grads


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"Lq{c[0]}-Lk{c[1]}-off{c[2]}-W{c[3]}")
@pytest.mark.parametrize("backend_name,scheme_name", accepted_pairs())
def test_backend_matches_reference(backend_name, scheme_name, case):
    lq, lk, offset, window = case
    scheme = scheme_for(scheme_name)
    with torch.no_grad():  # trained-looking parameters, not only the init draw
        for p in scheme.parameters():
            p.mul_(1.3)
    backend = resolve_backend(backend_name, scheme, CPU, F32, True)
    reference = resolve_backend("reference", scheme, CPU, F32, True)
    torch.manual_seed(hash(case) % 1000)
    q, k, v = torch.randn(B, H, lq, D), torch.randn(B, H, lk, D), torch.randn(B, H, lk, D)
    grad_out = torch.randn(B, H, lq, D)
    k_pos = torch.arange(lk) + offset
    q_pos = k_pos[lk - lq:]
    out, grads = run(backend, scheme, q, k, v, q_pos, k_pos, window, grad_out)
    ref_out, ref_grads = run(reference, scheme, q, k, v, q_pos, k_pos, window, grad_out)
    torch.testing.assert_close(out, ref_out, rtol=1e-4, atol=1e-5)
    names = ["dq", "dk", "dv"] + [n for n, p in scheme.named_parameters() if p.requires_grad]
    for name, g, ref_g in zip(names, grads, ref_grads):
        assert (g is None) == (ref_g is None), name
        if ref_g is not None:
            torch.testing.assert_close(g, ref_g, rtol=1e-4, atol=1e-5, msg=name)


# Grouped-query attention (megatron/attention/base.py): k, v with H_kv heads, query head h reading
# kv head h // (H / H_kv), against the reference run on explicitly repeated heads. A score-bias
# scheme and a rotation; full rows, and kv-cache rows under a window far from position 0.
GQA_SCHEMES = ["kerple_log", "rotary"]


def gqa_pairs():
    return [(b, s) for b, s in accepted_pairs() if s in GQA_SCHEMES] + [("reference", s) for s in GQA_SCHEMES]


@pytest.mark.parametrize("kv_heads", [2, 1], ids=["kv2", "kv1"])
@pytest.mark.parametrize("case", [CASES[0], CASES[4]], ids=lambda c: f"Lq{c[0]}-Lk{c[1]}-off{c[2]}-W{c[3]}")
@pytest.mark.parametrize("backend_name,scheme_name", gqa_pairs())
def test_grouped_query_matches_repeated_reference(backend_name, scheme_name, case, kv_heads):
    lq, lk, offset, window = case
    scheme = scheme_for(scheme_name)
    with torch.no_grad():
        for p in scheme.parameters():
            p.mul_(1.3)
    backend = resolve_backend(backend_name, scheme, CPU, F32, True)
    reference = resolve_backend("reference", scheme, CPU, F32, True)
    torch.manual_seed(11)
    q, k, v = torch.randn(B, H, lq, D), torch.randn(B, kv_heads, lk, D), torch.randn(B, kv_heads, lk, D)
    grad_out = torch.randn(B, H, lq, D)
    k_pos = torch.arange(lk) + offset
    q_pos = k_pos[lk - lq:]
    out, grads = run(backend, scheme, q, k, v, q_pos, k_pos, window, grad_out)
    ref_out, ref_grads = run(reference, scheme, q, k, v, q_pos, k_pos, window, grad_out, repeat=H // kv_heads)
    torch.testing.assert_close(out, ref_out, rtol=1e-4, atol=1e-5)
    names = ["dq", "dk", "dv"] + [n for n, p in scheme.named_parameters() if p.requires_grad]
    assert grads[1].shape == (B, kv_heads, lk, D)
    for name, g, ref_g in zip(names, grads, ref_grads):
        assert (g is None) == (ref_g is None), name
        if ref_g is not None:
            torch.testing.assert_close(g, ref_g, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("backend_name", ["sdpa", "reference"])
def test_kv_heads_must_divide_query_heads(backend_name):
    scheme = scheme_for("kerple_log")
    backend = resolve_backend(backend_name, scheme, CPU, F32, True)
    q, kv, pos = torch.randn(1, H, 5, D), torch.randn(1, 3, 5, D), torch.arange(5)
    with pytest.raises(ValueError, match="4 query heads and 3 key/value heads"):
        backend.forward(q, kv, kv, scheme, pos, pos)


def test_score_bias_schemes_reach_a_fast_backend():
    # Guard against accepted_pairs() silently shrinking to nothing.
    assert ("sdpa", "kerple_log") in accepted_pairs()
    assert ("sdpa", "kerple_power_ap_") in accepted_pairs()


@pytest.mark.parametrize("name", ["kerple_power_ap_ap", "kerple_power__ap"])
def test_sdpa_refuses_score_weight(name):
    with pytest.raises(ValueError) as err:
        resolve_backend("sdpa", scheme_for(name), CPU, F32, True)
    msg = str(err.value)
    assert "'sdpa'" in msg and "multiplies the scores" in msg and "reference" in msg


def test_unknown_backend():
    with pytest.raises(ValueError, match="unknown attention backend 'flashy'.*reference"):
        resolve_backend("flashy", scheme_for("kerple_log"), CPU, F32, True)


def test_auto_prefers_sdpa_and_logs(caplog):
    with caplog.at_level(logging.INFO, logger="megatron.attention"):
        assert resolve_backend("auto", scheme_for("kerple_log"), CPU, F32, True).name == "sdpa"
    assert "sdpa" in caplog.text and "kerple_log" in caplog.text
    assert resolve_backend("auto", scheme_for("kerple_power_ap_ap"), CPU, F32, True).name == "reference"
    assert backend_names()[-1] == "reference"


def naive_kerple_log_attention(q, k, v, p, a):
    """Plain loops in float64: causal softmax(q.k/sqrt(D) - p log(1 + a (i-j))) @ v."""
    Bn, Hn, L, Dn = q.shape
    out = [[[[0.0] * Dn for _ in range(L)] for _ in range(Hn)] for _ in range(Bn)]
    for b in range(Bn):
        for h in range(Hn):
            for i in range(L):
                logits = [sum(float(q[b, h, i, c]) * float(k[b, h, j, c]) for c in range(Dn))
                          / math.sqrt(Dn) - p[h] * math.log(1 + a[h] * (i - j)) for j in range(i + 1)]
                m = max(logits)
                w = [math.exp(x - m) for x in logits]
                total = sum(w)
                for c in range(Dn):
                    out[b][h][i][c] = sum(w[j] * float(v[b, h, j, c]) for j in range(i + 1)) / total
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("dtype,softmax_in_fp32,tol", [
    (torch.float32, False, 1e-5), (torch.float32, True, 1e-5), (torch.bfloat16, True, 3e-2)])
def test_reference_against_naive_loop(dtype, softmax_in_fp32, tol):
    scheme = scheme_for("kerple_log")
    torch.manual_seed(3)
    q, k, v = (torch.randn(1, H, 6, D) for _ in range(3))
    pos = torch.arange(6)
    p = [max(float(x), 0.01) for x in scheme.bias_p.detach().flatten()]
    a = [max(float(x), 0.01) for x in scheme.bias_a.detach().flatten()]
    expected = naive_kerple_log_attention(q, k, v, p, a)
    backend = resolve_backend("reference", scheme, CPU, dtype, False)
    with torch.no_grad():
        got = backend.forward(q.to(dtype), k.to(dtype), v.to(dtype), scheme, pos, pos,
                              softmax_in_fp32=softmax_in_fp32)
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("case", [CASES[0], CASES[4]], ids=lambda c: f"Lq{c[0]}-Lk{c[1]}-off{c[2]}-W{c[3]}")
@pytest.mark.parametrize("backend_name,scheme_name", accepted_pairs())
def test_backend_matches_reference_bf16(backend_name, scheme_name, case):
    """bf16 inputs: output and every gradient, including the scheme's parameters, within 1e-2
    (relative to the largest value) of the reference run in fp32 on the same rounded inputs, or
    within 2x of the reference backend's own bf16 error (FlashAttention's test criterion): at 9
    keys a parameter gradient is a sum with heavy cancellation, and the bf16 reference itself is
    then off by up to 3e-2."""
    lq, lk, offset, window = case
    scheme = scheme_for(scheme_name)
    backend = resolve_backend(backend_name, scheme, CPU, torch.bfloat16, True)
    reference = resolve_backend("reference", scheme, CPU, F32, True)
    torch.manual_seed(7)
    q, k, v = (torch.randn(B, H, n, D).bfloat16() for n in (lq, lk, lk))
    grad_out = torch.randn(B, H, lq, D)
    k_pos = torch.arange(lk) + offset
    q_pos = k_pos[lk - lq:]
    out, grads = run(backend, scheme, q, k, v, q_pos, k_pos, window, grad_out.bfloat16())
    bf16_ref_out, bf16_ref_grads = run(resolve_backend("reference", scheme, CPU, torch.bfloat16, True), scheme,
                                       q, k, v, q_pos, k_pos, window, grad_out.bfloat16())
    ref_out, ref_grads = run(reference, scheme, q.float(), k.float(), v.float(), q_pos, k_pos, window, grad_out)
    names = ["out", "dq", "dk", "dv"] + [n for n, p in scheme.named_parameters() if p.requires_grad]
    for name, g, bf16_g, ref_g in zip(names, (out, *grads), (bf16_ref_out, *bf16_ref_grads), (ref_out, *ref_grads)):
        if ref_g is None:
            continue
        scale = max(ref_g.abs().max().item(), 1e-6)
        err = (g.float() - ref_g).abs().max().item() / scale
        limit = max(1e-2, 2 * (bf16_g.float() - ref_g).abs().max().item() / scale)
        assert err <= limit, f"{backend_name}/{scheme_name} {name}: relative error {err:.2e} > {limit:.2e}"


def test_resolution_records_no_autograd():
    """The pipeline model resolves inside a checkpointed layer on its first call only: anything
    resolution saved for backward would break the checkpoint's recomputation."""
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        for name in ("auto", "sdpa", "triton", "flex"):
            try:
                resolve_backend(name, scheme_for("kerple_log_3para"), CPU, F32, True)
            except ValueError:
                pass
    assert packed == []


THROWAWAY_BACKEND = '''"""A throwaway backend: the scores materialised in float64, then rounded (a test's)."""
import math

import torch

from megatron.attention.base import AttentionBackend, kv_group, repeat_kv
from megatron.attention.mask import allowed_mask
from megatron.attention.registry import register_backend


@register_backend("throwaway", priority=2000)
class Throwaway(AttentionBackend):
    def unsupported_reason(self, scheme, device, dtype, training, dropout=False):
        return "it takes no dropout" if dropout else None

    def forward(self, q, k, v, scheme, q_pos, k_pos, window=None, softmax_in_fp32=False, dropout_p=0.0,
                prepared=None, row_starts=None, documents=None):
        group = kv_group(q, k)
        k, v = repeat_kv(k, group), repeat_kv(v, group)
        scores = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(q.shape[-1])
        weight = scheme.batch_score_weight(q_pos, k_pos, row_starts)
        bias = scheme.batch_score_bias(q_pos, k_pos, row_starts)
        scores = scores * (1 if weight is None else weight.double()) + (0 if bias is None else bias.double())
        scores = scores.masked_fill(~allowed_mask(q_pos, k_pos, window, row_starts), float("-inf"))
        return (scores.softmax(-1) @ v.double()).to(q.dtype)
'''


def test_a_new_backend_is_one_file(tmp_path):
    """docs/architecture.md, "An attention backend": one file with an @register_backend class. The
    config's reader takes its name from the file without importing it (backend_names), the registry
    from the import; resolve_backend then serves it, and it is held to the reference here like the
    package's own backends (a throwaway file, imported from a temporary folder, unregistered after)."""
    import importlib.util

    from megatron.attention import registry
    from megatron.config.backend_names import backend_names as names_in_files

    path = tmp_path / "throwaway.py"
    path.write_text(THROWAWAY_BACKEND, encoding="utf-8")
    assert names_in_files(str(tmp_path)) == ["throwaway"]
    spec = importlib.util.spec_from_file_location("throwaway_backend", path)
    try:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        assert backend_names()[-1] == "throwaway"  # priority 2000: after the reference, never "auto"'s choice
        scheme = scheme_for("kerple_power_ap_ap")  # a bias and a weight
        backend = resolve_backend("throwaway", scheme, CPU, F32, True)
        with pytest.raises(ValueError, match="cannot run .* it takes no dropout"):
            resolve_backend("throwaway", scheme, CPU, F32, True, dropout=True)
        reference = resolve_backend("reference", scheme, CPU, F32, True)
        q, k, v, grad_out = (torch.randn(B, H, 9, D, generator=torch.Generator().manual_seed(i)) for i in range(4))
        pos = torch.arange(9)
        out, grads = run(backend, scheme, q, k, v, pos, pos, None, grad_out)
        ref_out, ref_grads = run(reference, scheme, q, k, v, pos, pos, None, grad_out)
        torch.testing.assert_close(out, ref_out, rtol=1e-4, atol=1e-5)
        for g, ref_g in zip(grads, ref_grads):
            torch.testing.assert_close(g, ref_g, rtol=1e-4, atol=1e-5)
    finally:
        registry._REGISTRY.pop("throwaway", None)
        registry._PRIORITY.pop("throwaway", None)
