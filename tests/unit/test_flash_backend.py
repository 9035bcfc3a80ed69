"""The flash backend (flash-attn's flash_attn_func with alibi_slopes).

flash-attn is optional and not installable on CPU machines, so besides the refusals the CPU tests
swap in `documented_flash_attn_func`: flash_attn_func's documented semantics (bottom-right
causal alignment, ALiBi -slope * |i + Lk - Lq - j|, window_size), written from indices alone.
That checks our translation (layout, slopes, window) against the API, not the CUDA kernel; the
real kernel is compared with the reference under CUDA with flash-attn installed."""
import importlib.util

import pytest
import torch

import megatron.attention.flash as flash
from megatron.attention import resolve_backend
from megatron.positional.base import PositionalSpec
from megatron.positional.registry import build_scheme

CPU, F32, BF16 = torch.device("cpu"), torch.float32, torch.bfloat16
B, H, D = 2, 4, 16
SPEC = PositionalSpec(num_heads=H, head_dim=D, hidden_size=H * D, max_position_embeddings=64)
HAS_FLASH_ATTN = importlib.util.find_spec("flash_attn") is not None
# (Lq, Lk, offset, window): full rows, kv-cache rows, positions far from 0, windows
CASES = [(9, 9, 0, None), (3, 9, 0, None), (9, 9, 1000, None), (9, 9, 0, 4), (3, 9, 50, 4)]
FLASH_SCHEMES = ["alibi", "kerple_power_original", "rotary", "none"]


def make_scheme(name):
    torch.manual_seed(0)
    return build_scheme(name, SPEC)


def documented_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                               window_size=(-1, -1), alibi_slopes=None):
    """flash_attn_func per its docstring, in float64. q: (B, Lq, H, D); k, v: (B, Lk, H_kv, D),
    H_kv dividing H ("MQA/GQA by passing in KV with fewer heads than Q": query heads 0..H/H_kv - 1
    attend to kv head 0, the next H/H_kv to kv head 1, ...)."""
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1, "last dim must be contiguous"
    assert dropout_p == 0.0
    assert k.shape[2] == v.shape[2] and q.shape[2] % k.shape[2] == 0, "kv heads must divide query heads"
    group = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    lq, lk = q.shape[1], k.shape[1]
    i = torch.arange(lq)[:, None]
    j = torch.arange(lk)[None, :]
    scores = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) * softmax_scale  # (B, H, Lq, Lk)
    if alibi_slopes is not None:
        assert alibi_slopes.dtype == torch.float32 and alibi_slopes.shape == (q.shape[2],)
        assert alibi_slopes.is_contiguous() and not alibi_slopes.requires_grad
        scores = scores - alibi_slopes.double()[:, None, None] * (i + lk - lq - j).abs()
    allowed = torch.ones(lq, lk, dtype=torch.bool)
    if causal:
        allowed &= j <= i + lk - lq
    if window_size[0] >= 0:
        allowed &= j >= i + lk - lq - window_size[0]
    if window_size[1] >= 0:
        allowed &= j <= i + lk - lq + window_size[1]
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return torch.einsum("bhqk,bkhd->bqhd", probs, v.double()).to(q.dtype)


@pytest.fixture
def fake_flash(monkeypatch):
    monkeypatch.setattr(flash, "flash_attn_func", documented_flash_attn_func)


def inputs(case, device=CPU, dtype=F32, seed=0, kv_heads=H):
    """q (B, H, Lq, D), k and v (B, kv_heads, Lk, D) (grouped-query attention below H), positions."""
    lq, lk, offset, _ = case
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, heads, n, D, generator=g).to(device, dtype)
               for heads, n in ((H, lq), (kv_heads, lk), (kv_heads, lk)))
    k_pos = torch.arange(lk, device=device) + offset
    return q, k, v, k_pos[lk - lq:], k_pos


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"Lq{c[0]}-Lk{c[1]}-off{c[2]}-W{c[3]}")
@pytest.mark.parametrize("name", FLASH_SCHEMES)
def test_translation_matches_reference(name, case, fake_flash):
    scheme = make_scheme(name)
    backend = flash.FlashAttention()
    assert flash._scheme_problem(scheme, training=True) is None
    reference = resolve_backend("reference", scheme, CPU, F32, False)
    q, k, v, q_pos, k_pos = inputs(case)
    q, k = scheme.rotate_qk(q, k, q_pos, k_pos)
    with torch.no_grad():
        got = backend.forward(q, k, v, scheme, q_pos, k_pos, window=case[3])
        want = reference.forward(q, k, v, scheme, q_pos, k_pos, window=case[3])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kv_heads", [2, 1], ids=["kv2", "kv1"])
@pytest.mark.parametrize("name", ["alibi", "rotary"])
def test_grouped_query_translation_matches_reference(name, kv_heads, fake_flash):
    """k, v with fewer heads go to flash-attn as they are; ALiBi's slopes stay per query head."""
    scheme = make_scheme(name)
    reference = resolve_backend("reference", scheme, CPU, F32, False)
    for case in (CASES[0], CASES[4]):
        q, k, v, q_pos, k_pos = inputs(case, kv_heads=kv_heads)
        q, k = scheme.rotate_qk(q, k, q_pos, k_pos)
        with torch.no_grad():
            got = flash.FlashAttention().forward(q, k, v, scheme, q_pos, k_pos, window=case[3])
            want = reference.forward(q, k, v, scheme, q_pos, k_pos, window=case[3])
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_queries_must_be_the_last_keys(fake_flash):
    scheme = make_scheme("alibi")
    q, k, v, _, k_pos = inputs((3, 9, 0, None))
    with pytest.raises(ValueError, match=r"q_pos = k_pos\[-Lq:\]"):
        flash.FlashAttention().forward(q, k, v, scheme, k_pos[:3], k_pos)  # the FIRST keys


@pytest.mark.skipif(HAS_FLASH_ATTN, reason="flash-attn is installed here")
def test_not_installed():
    with pytest.raises(ValueError) as err:
        resolve_backend("flash", make_scheme("alibi"), CPU, BF16, False)
    msg = str(err.value)
    assert "'flash'" in msg and flash.NOT_INSTALLED in msg
    assert "reference" in msg.split("Backends that support it:")[1]


@pytest.mark.parametrize("name,training,reason", [
    ("kerple_log", True, "has a learnable log bias; flash-attn's only bias is ALiBi's -slope * distance and it "
                         "gives no gradient to alibi_slopes; use triton or flex"),
    ("kerple_power_ap_", True, "learnable d**p power bias"),
    ("rpe", True, "learnable lookup bias"),
    ("kerple_log", False, "has a log bias; flash-attn's only bias is ALiBi's -slope * distance; use triton or flex"),
    ("kerple_power_ap_ap", False, "multiplies the scores"),
])
def test_refuses_biases_it_cannot_express(name, training, reason):
    with pytest.raises(ValueError) as err:
        resolve_backend("flash", make_scheme(name), CPU, BF16, training)
    msg = str(err.value)
    assert "'flash'" in msg and reason in msg
    assert "reference" in msg.split("Backends that support it:")[1]


def test_refusals_once_installed(fake_flash):
    backend, alibi = flash.FlashAttention(), make_scheme("alibi")
    assert "CUDA only" in backend.unsupported_reason(alibi, CPU, BF16, True)
    assert "fp16/bf16 only, not float32" in backend.unsupported_reason(alibi, torch.device("cuda"), F32, True)
    assert backend.unsupported_reason(alibi, CPU, BF16, True, dropout=True) == \
        backend.unsupported_reason(alibi, CPU, BF16, True)  # dropout itself is supported


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and HAS_FLASH_ATTN), reason="needs CUDA and flash-attn")
@pytest.mark.parametrize("kv_heads", [H, 2, 1], ids=["mha", "kv2", "kv1"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"Lq{c[0]}-Lk{c[1]}-off{c[2]}-W{c[3]}")
def test_cuda_alibi_bf16_matches_reference(case, kv_heads):
    cuda = torch.device("cuda")
    scheme = make_scheme("alibi").to(cuda)
    backend = resolve_backend("flash", scheme, cuda, BF16, True)
    reference = resolve_backend("reference", scheme, cuda, F32, True)
    q, k, v, q_pos, k_pos = inputs(case, cuda, BF16, kv_heads=kv_heads)
    grad_out = torch.randn(B, H, case[0], D, device=cuda)
    results = []
    for be, xs in ((backend, (q, k, v)), (reference, (q.float(), k.float(), v.float()))):
        xs = [x.detach().clone().requires_grad_(True) for x in xs]
        out = be.forward(*xs, scheme, q_pos, k_pos, window=case[3])
        grads = torch.autograd.grad((out.float() * grad_out).sum(), xs)
        results.append([out.detach(), *grads])
    for label, g, w in zip(["out", "dq", "dk", "dv"], *results):
        err = (g.float() - w).abs().max() / w.abs().max()
        assert err <= 1e-2, f"{case} {label}: relative error {err:.2e}"


# ---- packed documents: flash_attn_varlen_func ------------------------------------------------------
STARTS = [[0] * 4 + [4] * 7 + [11] * 5, [0] * 9 + [9] + [10] * 6]  # (2, 16): 3 + 3 documents, one of 1 token


def documented_flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **options):
    """flash_attn_varlen_func per its docstring: q (total_q, H, D), k and v (total_k, H_kv, D), sequence
    s the rows cu_seqlens[s] .. cu_seqlens[s + 1] - 1 (int32), each attended as flash_attn_func attends
    one batch row, no longer than max_seqlen."""
    assert cu_seqlens_q.dtype == torch.int32 and torch.equal(cu_seqlens_q, cu_seqlens_k)
    bounds = cu_seqlens_q.tolist()
    assert bounds[0] == 0 and bounds[-1] == q.shape[0] == k.shape[0]
    outs = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        assert 0 < b - a <= min(max_seqlen_q, max_seqlen_k)
        outs.append(documented_flash_attn_func(q[None, a:b], k[None, a:b], v[None, a:b], **options)[0])
    return torch.cat(outs)


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("name", FLASH_SCHEMES)
def test_documents_translation_matches_reference(name, window, monkeypatch):
    """Each document one varlen sequence: the same as the reference's document mask (CPU: the documented
    semantics; the CUDA kernel below)."""
    from megatron.attention.documents import PackedDocuments

    monkeypatch.setattr(flash, "flash_attn_func", documented_flash_attn_func)
    monkeypatch.setattr(flash, "flash_attn_varlen_func", documented_flash_attn_varlen_func)
    scheme = make_scheme(name)
    docs = PackedDocuments(torch.tensor(STARTS))
    assert docs.cu_seqlens.tolist() == [0, 4, 11, 16, 25, 26, 32]
    q, k, v, q_pos, k_pos = inputs((16, 16, 0, window), kv_heads=2)
    q, k = scheme.rotate_qk(q, k, q_pos, k_pos)
    reference = resolve_backend("reference", scheme, CPU, F32, False, documents=True)
    with torch.no_grad():
        got = flash.FlashAttention().forward(q, k, v, scheme, q_pos, k_pos, window=window, documents=docs.to(CPU))
        want = reference.forward(q, k, v, scheme, q_pos, k_pos, window=window, documents=docs)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_documents_count_their_starts_on_the_host():
    """Moved from the host, the documents count cu_seqlens from the host's starts: no device read per step."""
    from megatron.attention.documents import PackedDocuments

    moved = PackedDocuments(torch.tensor(STARTS)).to("meta")  # a device that can compute nothing
    assert moved.cu_seqlens.device.type == "meta" and moved.cu_seqlens.shape == (7,)
    assert "cu_seqlens" not in PackedDocuments(torch.tensor(STARTS)).to("meta").__dict__  # only when asked


def test_drawn_positions_are_refused_by_name():
    with pytest.raises(ValueError, match="gapped positions would be read as consecutive"):
        resolve_backend("flash", make_scheme("alibi"), CPU, BF16, True, sampled=True)


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and HAS_FLASH_ATTN), reason="needs CUDA and flash-attn")
@pytest.mark.parametrize("name", ["alibi", "rotary"])
def test_cuda_documents_bf16_match_reference(name):
    from megatron.attention.documents import PackedDocuments

    cuda = torch.device("cuda")
    scheme = make_scheme(name).to(cuda)
    docs = PackedDocuments(torch.tensor(STARTS)).to(cuda)
    backend = resolve_backend("flash", scheme, cuda, BF16, True, documents=True)
    reference = resolve_backend("reference", scheme, cuda, F32, True, documents=True)
    q, k, v, q_pos, k_pos = inputs((16, 16, 0, None), cuda, BF16, kv_heads=2)
    q, k = scheme.rotate_qk(q, k, q_pos, k_pos)
    grad_out = torch.randn(B, H, 16, D, device=cuda)
    results = []
    for be, xs in ((backend, (q, k, v)), (reference, (q.float(), k.float(), v.float()))):
        xs = [x.detach().clone().requires_grad_(True) for x in xs]
        out = be.forward(*xs, scheme, q_pos, k_pos, documents=docs)
        grads = torch.autograd.grad((out.float() * grad_out).sum(), xs)
        results.append([out.detach(), *grads])
    for label, g, w in zip(["out", "dq", "dk", "dv"], *results):
        err = (g.float() - w).abs().max() / w.abs().max()
        assert err <= 1e-2, f"{name} {label}: relative error {err:.2e}"
