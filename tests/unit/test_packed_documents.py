"""Packed documents (reset-attention-mask + reset-position-ids, megatron/attention/documents.py): a
packed row equals its documents run alone, for every scheme and CPU backend, and the Triton kernels
(Triton's interpreter on CPU) and flex's block mask skip the tiles that lie wholly across
documents instead of computing and masking them."""
import importlib.util

import pytest
import torch

from megatron.attention import resolve_backend
from megatron.attention.documents import PackedDocuments
from megatron.config.scheme_options import scheme_names
from megatron.data.position_recipes import document_starts
from megatron.model import GPTModel
from megatron.positional.base import PositionalSpec
from megatron.positional.distance import position_run
from megatron.positional.registry import build_scheme

EOD = 0
DOCS = [[5, 9, 3, EOD], [7, 7, 2, 8, 1, 4, EOD], [6, 2, 11, 5, 3]]  # 16 tokens: three documents
CPU = torch.device("cpu")


def test_document_starts_follow_megatron():
    """Megatron-LM's get_ltor_masks_and_position_ids: the EOD stays in the document it ends; the
    positions restart at the token after it."""
    tokens = torch.tensor([[3, EOD, 4, 5, EOD, EOD, 6], [EOD, 1, 2, 3, 4, 5, 6]])
    starts = document_starts(tokens, EOD)
    assert starts.tolist() == [[0, 0, 2, 2, 2, 5, 6], [0, 1, 1, 1, 1, 1, 1]]
    docs = PackedDocuments(starts, reset_positions=True)
    assert docs.positions.tolist() == [[0, 1, 0, 1, 2, 0, 0], [0, 0, 1, 2, 3, 4, 5]]
    assert docs.ends.tolist() == [[2, 2, 5, 5, 5, 6, 7], [1, 7, 7, 7, 7, 7, 7]]


def _model(tiny_config, name, backend, seq_length=16, max_positions=16, rpe_max_distance=12):
    """A one-layer model of `name` on `backend` in training mode, with trained-looking positional
    parameters (not only the init draw); test_position_recipes.py builds its models here too."""
    cfg = tiny_config(pos_emb=name, attention_backend=backend, num_layers=1, hidden_size=16,
                      num_attention_heads=2, seq_length=seq_length, max_position_embeddings=max_positions,
                      rpe_num_buckets=8, rpe_max_distance=rpe_max_distance)
    torch.manual_seed(0)
    model = GPTModel(cfg.model, 32).train()
    with torch.no_grad():
        for p in model.position.parameters():
            p.mul_(1.3)
    return model


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def packed_and_alone(model):
    """(loss, gradients) of one packed row, and of its documents run alone from position 0 (the
    same token-sum over the same count), in fp32."""
    row = torch.tensor([sum(DOCS, [])])
    labels = torch.roll(row, -1, dims=1)
    n = row.numel()
    docs = PackedDocuments(document_starts(row, EOD), reset_positions=True)
    model.zero_grad(set_to_none=True)
    packed = model(row, labels=labels, documents=docs)
    packed.backward()
    packed_grads = _grads(model)
    model.zero_grad(set_to_none=True)
    alone, start = 0.0, 0
    for doc in DOCS:
        end = start + len(doc)
        x = model.hidden_states(row[:, start:end])
        alone = alone + model._token_losses_from_hidden(x, labels[:, start:end]).sum() / n
        start = end
    alone.backward()
    return (packed, packed_grads), (alone, _grads(model))


def _sdpa_cannot(name):
    return name.startswith("kerple_power") and name.endswith("_ap")  # a score weight: SDPA refuses it


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
@pytest.mark.parametrize("name", scheme_names())
def test_packed_row_equals_documents_alone(tiny_config, name, backend):
    if backend == "sdpa" and _sdpa_cannot(name):
        pytest.skip("SDPA refuses score-weight schemes (resolver)")
    (packed, packed_grads), (alone, alone_grads) = packed_and_alone(_model(tiny_config, name, backend))
    assert abs(packed.item() - alone.item()) <= 1e-6
    assert packed_grads.keys() == alone_grads.keys()
    for key, grad in packed_grads.items():
        torch.testing.assert_close(grad, alone_grads[key], rtol=0, atol=1e-6, msg=f"{name} {backend} {key}")


def test_evaluation_without_documents_is_unchanged(tiny_config):
    """Documents are a training batch's: a forward without them is the plain causal model."""
    model = _model(tiny_config, "kerple_log", "reference").eval()
    row = torch.tensor([sum(DOCS, [])])
    one = torch.zeros_like(row)  # a single document: the mask is the causal one
    with torch.no_grad():
        plain = model(row)
        single = model(row, documents=PackedDocuments(one, reset_positions=True))
    torch.testing.assert_close(plain, single, rtol=0, atol=0)


# ---- the fused kernels: equal to the reference, and tiles across documents never computed ----------
triton_missing = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
STARTS = [[0] * 7 + [7] * 13 + [20] + [21] * 19 + [40] * 5, [0] * 33 + [33] * 12]  # (2, 45): 5 + 2 documents


def _scheme(name, heads=2, head_dim=8):
    torch.manual_seed(0)
    spec = PositionalSpec(num_heads=heads, head_dim=head_dim, hidden_size=heads * head_dim, max_position_embeddings=64,
                          options={"rpe_num_buckets": 8, "rpe_max_distance": 20})
    return build_scheme(name, spec)


def _attend(backend_name, scheme, q, k, v, grad_out, documents):
    backend = resolve_backend(backend_name, scheme, CPU, torch.float32, True, documents=True)
    q, k, v = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    pos = position_run(0, q.shape[2], CPU)
    out = backend.forward(q, k, v, scheme, pos, pos, softmax_in_fp32=True, documents=documents)
    params = [p for p in scheme.parameters() if p.requires_grad]
    return [out.detach(), *torch.autograd.grad((out * grad_out).sum(), [q, k, v] + params)]


@triton_missing
@pytest.mark.gpu
@pytest.mark.parametrize("name", ["kerple_power_ap_ap", "rpe"])  # a log bias with a weight; a learned table
def test_triton_documents_match_reference(name, monkeypatch):
    """Forward, dq, dk, dv and the parameter gradients, over documents that start inside tiles
    and a one-token document (16-wide tiles: masked, unmasked and skipped tiles all occur)."""
    monkeypatch.setenv("KERPLE_TRITON_BLOCKS", "16,16,16,16")
    scheme = _scheme(name)
    g = torch.Generator().manual_seed(1)
    q, k, v, grad_out = (torch.randn(2, 2, 45, 8, generator=g) for _ in range(4))
    docs = PackedDocuments(torch.tensor(STARTS), reset_positions=True)
    want = _attend("reference", scheme, q, k, v, grad_out, docs)
    got = _attend("triton", scheme, q, k, v, grad_out, docs)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-5)


def _count_dots(monkeypatch, module):
    """Count the kernel module's tl.dot calls (Triton's interpreter runs the kernels as Python):
    each visited tile makes a fixed number of them, a skipped tile none."""
    calls = []
    original = module.mm

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, "mm", counting)
    return calls


@triton_missing
@pytest.mark.gpu
def test_triton_skips_tiles_across_documents(monkeypatch):
    """64 tokens in four documents of 16, 16-wide tiles: the forward visits the 4 diagonal tiles
    (8 dots: QK^T and PV each), not the causal 10 (20 dots); the backward's kernels likewise."""
    if torch.cuda.is_available():
        pytest.skip("counts the interpreter's calls")
    import megatron.attention.kernels.attention_bwd as bwd
    import megatron.attention.kernels.attention_fwd as fwd
    from megatron.attention.kernels.attention import triton_attention

    monkeypatch.setenv("KERPLE_TRITON_BLOCKS", "16,16,16,16")
    scheme = _scheme("alibi", heads=1)
    q, k, v = (torch.randn(1, 1, 64, 8, requires_grad=True) for _ in range(3))
    bounds = PackedDocuments((torch.arange(64) // 16 * 16)[None]).bounds
    forward, backward = _count_dots(monkeypatch, fwd), _count_dots(monkeypatch, bwd)
    out = triton_attention(q, k, v, scheme.fused_kernel(), 0, 0)
    out.sum().backward()
    causal = (len(forward), len(backward))
    forward.clear()
    backward.clear()
    out = triton_attention(q, k, v, scheme.fused_kernel(), 0, 0, doc_bounds=bounds)
    out.sum().backward()
    assert causal == (20, 70)  # 10 tiles: 2 dots each forward, 7 each in the two backward kernels together
    assert (len(forward), len(backward)) == (8, 28)  # the 4 diagonal tiles only


def test_flex_block_mask_skips_tiles_across_documents():
    """flex's block mask from the documents' starts drops every block wholly across documents, and
    its (eager, uncompiled) forward equals the reference's."""
    from megatron.attention.flex import FlexAttention, _document_block_mask

    L = 512  # flex's blocks are 128 x 128: four documents of 128 leave the 4 diagonal blocks
    starts = (torch.arange(L) // 128 * 128)[None]
    causal = _document_block_mask(L, None, torch.zeros(1, L, dtype=torch.long))
    packed = _document_block_mask(L, None, starts)
    assert int(causal.kv_num_blocks.sum() + causal.full_kv_num_blocks.sum()) == 10
    assert int(packed.kv_num_blocks.sum() + packed.full_kv_num_blocks.sum()) == 4
    flex = FlexAttention()
    flex.eager_on_cpu = True
    scheme = _scheme("kerple_log")
    q, k, v = (torch.randn(1, 2, L, 8) for _ in range(3))
    docs = PackedDocuments(torch.tensor(STARTS[:1] + STARTS[1:])[:, :45])
    pos = position_run(0, 45, CPU)
    with torch.no_grad():
        got = flex.forward(q[:, :, :45].expand(2, -1, -1, -1), k[:, :, :45].expand(2, -1, -1, -1),
                           v[:, :, :45].expand(2, -1, -1, -1), scheme, pos, pos, documents=docs)
        want = resolve_backend("reference", scheme, CPU, torch.float32, False).forward(
            q[:, :, :45].expand(2, -1, -1, -1), k[:, :, :45].expand(2, -1, -1, -1),
            v[:, :, :45].expand(2, -1, -1, -1), scheme, pos, pos, softmax_in_fp32=True, documents=docs)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name,window", [("kerple_log", None), ("fire", None), ("alibi", 50)])
def test_sdpa_document_chunks_match_reference(name, window):
    """SDPA's packed-document route (sdpa.py: query chunks, each against the keys from its first
    document on) over several chunks, with a query-dependent bias at positions within the documents
    (FIRE) and a window: forward and every gradient as the reference's dense mask."""
    from megatron.attention import sdpa

    L = 3 * sdpa.DOCUMENT_QUERY_CHUNK + 5
    starts = torch.zeros(2, L, dtype=torch.long)
    for b, cuts in enumerate([[30, 100, 101, 150], [50, 120, 170]]):
        for c in cuts:
            starts[b, c:] = c
    docs = PackedDocuments(starts, reset_positions=True)
    scheme = _scheme(name)
    g = torch.Generator().manual_seed(2)
    q, k, v, grad_out = (torch.randn(2, 2, L, 8, generator=g) for _ in range(4))
    backend = resolve_backend("sdpa", scheme, CPU, torch.float32, True, documents=True)
    pos = position_run(0, L, CPU)
    chunks = backend.prepare(scheme, pos, pos, window, documents=docs).document_chunks
    # each chunk's first key: the earliest document start of its first query over the rows, or the
    # window's edge (not reached here): the keys before it are never computed
    assert [k0 for _, _, k0, _ in chunks] == [0, 30, 101, 150]
    # one long document: without a window the chunks would skip too little, and one call takes the row
    one_long = PackedDocuments(torch.where(starts[:1] < 150, 0, 150).expand(2, -1))
    expect = [(0, L, 0)] if window is None else [(0, 64, 0), (64, 128, 15), (128, 192, 79), (192, L, 150)]
    got = backend.prepare(scheme, pos, pos, window, documents=one_long).document_chunks
    assert [(r0, r1, k0) for r0, r1, k0, _ in got] == expect
    want = _attend_windowed("reference", scheme, q, k, v, grad_out, docs, window)
    got = _attend_windowed("sdpa", scheme, q, k, v, grad_out, docs, window)
    for i, (a, b) in enumerate(zip(got, want)):  # out, dq, dk, dv as test_attention_backends.py; the
        # parameter gradients are sums over ~10^4 scores that cancel (FIRE's out_bias: exactly 0 in
        # exact arithmetic, a per-head constant shifts a softmax row), summed in other orders here
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 if i < 4 else 5e-5)


def _attend_windowed(backend_name, scheme, q, k, v, grad_out, documents, window):
    backend = resolve_backend(backend_name, scheme, CPU, torch.float32, True, documents=True)
    q, k, v = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    pos = position_run(0, q.shape[2], CPU)
    out = backend.forward(q, k, v, scheme, pos, pos, window=window, softmax_in_fp32=True, documents=documents)
    params = [p for p in scheme.parameters() if p.requires_grad]
    return [out.detach(), *torch.autograd.grad((out * grad_out).sum(), [q, k, v] + params)]


def test_documents_past_xpos_span_are_refused_with_the_fix(tiny_config):
    """xPos rotates its queries in blocks past its span (mask.query_blocks); packed documents
    describe the whole row, so that case is refused naming the scheme and the fix."""
    cfg = tiny_config(pos_emb="xpos", attention_backend="reference", num_layers=1, hidden_size=16,
                      num_attention_heads=2, seq_length=16, max_position_embeddings=16, xpos_scale_base=0.25)
    model = GPTModel(cfg.model, 32).train()
    row = torch.tensor([sum(DOCS, [])])
    span = model.position.max_query_span(torch.float32)
    assert span < row.shape[1]
    with pytest.raises(ValueError, match=f"pos-emb 'xpos' rotates at most {span} per call"):
        model(row, labels=row, documents=PackedDocuments(document_starts(row, EOD), reset_positions=True))
