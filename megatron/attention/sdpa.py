"""PyTorch scaled_dot_product_attention backend.

No bias and no window with q_pos == k_pos == consecutive positions: the built-in causal path
(is_causal=True, no mask tensor). Otherwise the scheme's bias and the causal/window mask are
folded into one float mask (bias + where(allowed, 0, -inf)); SDPA adds it after its scaling,
the same placement as the reference, and autograd carries the gradient back through the mask
to the scheme's parameters. SDPA cannot multiply scores, so score_weight schemes are refused.

CPU inference (autograd off) over consecutive positions takes a faster route to the same
attention (docs/benchmarks.md, "evaluation forward"; 2.9x `none` before, at 2,048 tokens):
  - the mask is never materialised: the bias depends only on the distance, so the scheme's
    formula is evaluated once per diagonal (Lq + Lk - 1 values per head), and with the keys in
    reverse order the mask is a strided VIEW of that row (mask[i, j'] = diag[i + j'], for key
    Lk - 1 - j'); k and v are flipped to match (a copy of (B, H, Lk, D), not of (H, Lq, Lk));
  - it is 4-D (1, H, Lq, Lk): torch's fused CPU kernel takes a 4-D mask, a 3-D one sends SDPA
    to its unfused math path (3x slower at 2,048 tokens);
  - queries run in chunks of QUERY_CHUNK rows, each against only the keys it can see (a key
    after the chunk's last query, or out of its first query's window, is masked for every row),
    since with a mask the kernel cannot skip the masked triangle as is_causal does.
The outputs differ from the math path's by rounding only (the fused kernel sums in another
order). Training keeps the dense 3-D mask and the math path: its figures stay bit for bit.

Grouped-query k/v (B, H_kv, Lk, D) go to SDPA as they are, with enable_gqa=True (torch maps query
head h to kv head h // (H / H_kv)). Where that saves the (B, H, Lk, D) copy depends on the kernel
torch picks, not on us (torch 2.13, checked with the profiler on CPU: tools/bench_gqa_memory.py):
CPU's fused kernel (is_causal, and the 4-D mask of CPU inference) reads the kv heads in place,
forward and backward; the math path (the 3-D training mask, and every call whose mask needs a
gradient) repeats k and v itself, so there the copy remains, inside torch. On CUDA torch's flash,
memory-efficient and cuDNN kernels admit grouped heads (sdp_utils.cpp), to be confirmed on a GPU.

Padded batches (`row_starts`, megatron/attention/mask.py) take the dense route with a per-row
mask (B, H or 1, Lq, Lk): padding keys -inf, the bias at each row's positions where it depends
on them (FIRE).

Packed documents (megatron/attention/documents.py, training) run in query chunks of
DOCUMENT_QUERY_CHUNK rows, each against only the keys from its first document's start (the
earliest over the batch rows) to its last query, with a per-row float mask of that block (other
documents' keys -inf): keys wholly in earlier documents are never computed, so short documents
cost less than the unmasked step's dense mask (docs/benchmarks.md, "Packed documents"). When the
chunks would skip little (DOCUMENT_CHUNKED_SHARE) one call takes the whole per-row mask. Outputs
equal the dense mask's up to summation order (a masked key's exp is exactly 0)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from megatron.attention.base import AttentionBackend, kv_group
from megatron.attention.mask import allowed_mask, check_window, consecutive_starts
from megatron.attention.registry import register_backend
from megatron.positional.distance import causal_distance, run_slice

# Query rows per SDPA call in CPU inference (module docstring): the smaller, the less of the
# masked triangle is computed, and the more calls. Chosen by measurement (docs/benchmarks.md,
# "evaluation forward").
QUERY_CHUNK = 512
# Query rows per SDPA call with packed documents (module docstring): smaller chunks skip more of
# the keys before short documents, at one call per chunk. Chosen by measurement (docs/benchmarks.md,
# "Packed documents").
DOCUMENT_QUERY_CHUNK = 64
# The chunks run only when their (query, key) pairs are at most this share of the L x L the dense
# mask computes; else one call with the whole mask (a chunk's own call and mask cost more than the
# few keys it skips). Chosen by measurement (docs/benchmarks.md, "Packed documents").
DOCUMENT_CHUNKED_SHARE = 0.5


@dataclass(frozen=True)
class SDPAPrepared:
    # fp32 float mask: (H or 1, Lq, Lk), (B, H or 1, Lq, Lk) for padded rows, or (1, H or 1, Lq, Lk)
    # for CPU inference; or None: the built-in causal path.
    mask: torch.Tensor | None
    # CPU inference (module docstring): the mask's keys run last to first, and the queries run in
    # chunks (first row, end row, first key, end key), keys counted in that reversed order; None:
    # one call, keys in order.
    chunks: tuple[tuple[int, int, int, int], ...] | None = None
    # Packed documents (module docstring): per chunk of queries (first row, end row, first key,
    # its float mask (B, H or 1, rows, end row - first key)); None without documents.
    document_chunks: tuple[tuple[int, int, int, torch.Tensor], ...] | None = None


@register_backend("sdpa", priority=100)
class SDPAAttention(AttentionBackend):
    def unsupported_reason(self, scheme, device, dtype, training, dropout=False):
        if scheme.has_score_weight:
            return (f"pos-emb {scheme.name!r} multiplies the scores (score_weight) and SDPA can "
                    "only add a mask to them")
        return None

    def prepare(self, scheme, q_pos, k_pos, window=None, row_starts=None, documents=None):
        """The float mask (H or 1, Lq, Lk) in fp32 ((B, H or 1, Lq, Lk) for padded rows or packed
        documents), or None for the built-in causal path: no bias, no window, no padding, one
        document per row and q_pos == k_pos consecutive (is_causal=True then equals the positional mask)."""
        check_window(window)
        if documents is not None:
            return _prepare_documents(scheme, q_pos, k_pos, window, documents)
        padded = row_starts is not None
        if not padded and not scheme.has_score_bias and window is None and _is_plain_causal(q_pos, k_pos):
            return SDPAPrepared(None)
        if not padded and q_pos.device.type == "cpu" and not torch.is_grad_enabled():
            prepared = _prepare_cpu_inference(scheme, q_pos, k_pos, window)
            if prepared is not None:
                return prepared
        bias = scheme.batch_score_bias(q_pos, k_pos, row_starts)  # (H, Lq, Lk) / (B, H, Lq, Lk) fp32, or None
        allowed = allowed_mask(q_pos, k_pos, window, row_starts)  # (Lq, Lk) / (B, 1, Lq, Lk)
        mask = torch.zeros(allowed.shape, dtype=torch.float32, device=q_pos.device)
        mask = mask.masked_fill(~allowed, float("-inf"))
        if bias is not None:
            mask = bias + mask  # -inf stays -inf, gradient flows to the bias
        return SDPAPrepared(mask)

    def forward(self, q, k, v, scheme, q_pos, k_pos, window=None, softmax_in_fp32=False,
                dropout_p=0.0, prepared=None, row_starts=None, documents=None):
        # softmax_in_fp32 needs no flag: SDPA's kernels accumulate the softmax in fp32.
        assert not scheme.has_score_weight, "resolve_backend should have refused this scheme"
        scale = 1.0 / math.sqrt(q.shape[-1])
        gqa = kv_group(q, k) > 1  # the module docstring: torch maps the heads (multi-head: no flag)
        prepared = prepared or self.prepare(scheme, q_pos, k_pos, window, row_starts, documents)
        if prepared.document_chunks is not None:
            return torch.cat([
                F.scaled_dot_product_attention(q[:, :, r0:r1], k[:, :, k0:r1], v[:, :, k0:r1],
                                               attn_mask=mask.to(q.dtype), dropout_p=dropout_p, scale=scale,
                                               enable_gqa=gqa)
                for r0, r1, k0, mask in prepared.document_chunks], dim=2)  # (B, H, Lq, D)
        mask = prepared.mask
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True,
                                                  scale=scale, enable_gqa=gqa)
        mask = mask.to(q.dtype)
        if prepared.chunks is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                                  scale=scale, enable_gqa=gqa)  # (B, H, Lq, D)
        assert dropout_p == 0.0, "the chunked path is inference only"
        k, v = k.flip(2), v.flip(2)  # keys last to first, as in the mask (a copy of the kv heads only)
        out = q.new_empty(q.shape)
        for r0, r1, k0, k1 in prepared.chunks:
            out[:, :, r0:r1] = F.scaled_dot_product_attention(
                q[:, :, r0:r1], k[:, :, k0:k1], v[:, :, k0:k1], attn_mask=mask[..., r0:r1, k0:k1], scale=scale,
                enable_gqa=gqa)
        return out  # (B, H, Lq, D)


def _prepare_documents(scheme, q_pos, k_pos, window, documents) -> SDPAPrepared:
    """The query chunks of packed documents (module docstring), each with the float mask of its
    block of keys; one host read of the chunks' first document starts."""
    if q_pos.shape != k_pos.shape:
        raise ValueError("packed documents need queries and keys at the same positions (no kv-cache)")
    length, starts, own = q_pos.shape[-1], documents.starts.to(q_pos.device), documents.within_positions()
    firsts = starts[:, ::DOCUMENT_QUERY_CHUNK].amin(dim=0).tolist()  # per chunk: its first query's earliest document start
    spans = []
    for r0, first in zip(range(0, length, DOCUMENT_QUERY_CHUNK), firsts):
        r1 = min(r0 + DOCUMENT_QUERY_CHUNK, length)
        spans.append((r0, r1, first if window is None else max(first, r0 - window + 1)))  # keys before k0: hidden
    if sum((r1 - r0) * (r1 - k0) for r0, r1, k0 in spans) > DOCUMENT_CHUNKED_SHARE * length * length:
        spans = [(0, length, 0)]  # too little to skip (long documents, or some row's document spans the chunks)
    chunks = []
    for r0, r1, k0 in spans:
        rows, keys = slice(r0, r1), slice(k0, r1)
        q_block, k_block = run_slice(q_pos, rows), run_slice(k_pos, keys)
        blocks = None if own is None else (own[:, rows], own[:, keys])
        bias = scheme.batch_score_bias(q_block, k_block, None, blocks)  # (H or B, H, rows, keys) or None
        allowed = allowed_mask(q_block, k_block, window, None, starts[:, rows], first_key=k0)  # (B, 1, rows, keys)
        mask = torch.zeros(allowed.shape, dtype=torch.float32, device=q_pos.device).masked_fill(~allowed, float("-inf"))
        chunks.append((r0, r1, k0, mask if bias is None else bias + mask))
    return SDPAPrepared(None, document_chunks=tuple(chunks))


def _is_plain_causal(q_pos: torch.Tensor, k_pos: torch.Tensor) -> bool:
    """True when is_causal=True (key index <= query index) equals the positional causal mask."""
    if q_pos.shape != k_pos.shape:
        return False
    if q_pos.numel() < 2:
        return torch.equal(q_pos, k_pos)
    starts = consecutive_starts(q_pos, k_pos)
    return starts is not None and starts[0] == starts[1]


def _prepare_cpu_inference(scheme, q_pos, k_pos, window) -> SDPAPrepared | None:
    """The mask and query chunks of the CPU inference route (module docstring), or None where it
    does not apply: a scheme without a distance description (fused_kernel() None), positions
    that are not consecutive runs, or a first query before the first key."""
    kernel = scheme.fused_kernel()
    starts = consecutive_starts(q_pos, k_pos)
    if kernel is None or starts is None or starts[0] < starts[1]:
        return None
    offset, lq, lk = starts[0] - starts[1], q_pos.numel(), k_pos.numel()
    mask = diagonal_mask(kernel, offset, lq, lk, window, q_pos.device)
    return SDPAPrepared(mask, query_chunks(offset, lq, lk, window))


def diagonal_mask(kernel, offset: int, lq: int, lk: int, window: int | None,
                  device: torch.device) -> torch.Tensor:
    """The float mask (1, H or 1, Lq, Lk) for queries at offset + i and keys at j, with the keys
    in REVERSE order (column j' is key Lk - 1 - j'), as a view of its diagonals: mask[i, j'] =
    diag[i + j'], where diag[t] is the bias at the distance offset - (Lk - 1) + t plus 0 or -inf
    (allowed_mask, the one mask rule). Nothing of size Lq x Lk is allocated."""
    dist = torch.arange(offset - (lk - 1), offset + lq, device=device)  # (Lq + Lk - 1,) int64
    zero = dist.new_zeros(1)
    allowed = allowed_mask(dist, zero, window)[:, 0]
    diag = torch.zeros(dist.shape, dtype=torch.float32, device=device).masked_fill(~allowed, float("-inf"))
    bias = kernel.bias_at(causal_distance(dist, zero).t(), largest=max(offset + lq - 1, 0))  # (H, 1, Lq+Lk-1) or None
    diag = diag[None] if bias is None else bias[:, 0] + diag  # (H or 1, Lq + Lk - 1)
    return diag.unfold(-1, lk, 1)[None]  # row i = diag[i : i + Lk]


def query_chunks(offset: int, lq: int, lk: int, window: int | None) -> tuple[tuple[int, int, int, int], ...]:
    """(r0, r1, k0, k1) for each run of QUERY_CHUNK query rows: rows r0..r1-1 (at positions
    offset + i, against keys at j) see at most the keys j in [j0, j1): none after the last row's
    position, and with a window W none at or before the first row's position - W. Returned in
    reversed key order (k0, k1 = Lk - j1, Lk - j0), as diagonal_mask lays the keys out."""
    chunks = []
    for r0 in range(0, lq, QUERY_CHUNK):
        r1 = min(r0 + QUERY_CHUNK, lq)
        j1 = min(lk, offset + r1)
        j0 = 0 if window is None else min(max(0, offset + r0 - window + 1), j1 - 1)  # never empty
        chunks.append((r0, r1, lk - j1, lk - j0))
    return tuple(chunks)
