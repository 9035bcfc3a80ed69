"""Autograd wrapper around the Triton attention kernels: triton_attention(q, k, v, kernel, ...).

Inputs follow the backend contract (megatron/attention/base.py): q (B, H, Lq, D), k/v (B, H, Lk, D)
with unit stride on D (views straight out of the fused QKV projection are fine), positions
consecutive (queries at q0 + i, keys at k0 + j). The scheme's DistanceKernel tensors (clamped,
autograd-attached) are autograd inputs, so their gradients flow back to the raw parameters.
Parameter gradients are reduced without atomics: per-key-block partials, then a torch sum."""
from __future__ import annotations

import os

import torch
import triton

from megatron.attention.mask import check_row_starts
from megatron.kernels.attention_bwd import attention_bwd_dkdv_kernel, attention_bwd_dq_kernel
from megatron.kernels.attention_fwd import attention_fwd_kernel
from megatron.kernels.distance_bias import BIAS_CODES

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


def block_sizes(head_dim: int, device: torch.device) -> tuple[int, int, int, int]:
    """(forward BLOCK_M, BLOCK_N, backward BLOCK_M, BLOCK_N). KERPLE_TRITON_BLOCKS="fm,fn,bm,bn"
    overrides (for tuning on a new GPU). The interpreter gets small blocks so tests stay quick
    and still cross block boundaries."""
    env = os.environ.get("KERPLE_TRITON_BLOCKS")
    if env:
        try:
            fm, fn, bm, bn = (int(x) for x in env.split(","))
        except ValueError:
            raise ValueError(f"KERPLE_TRITON_BLOCKS={env!r}: expected four integers 'fwd_m,fwd_n,bwd_m,bwd_n', "
                             "each a power of two >= 16") from None
        return fm, fn, bm, bn
    if device.type != "cuda":
        return 16, 16, 16, 16
    if head_dim <= 64:
        return 128, 64, 64, 64
    return 64, 64, 64, 32


def _vec(x: torch.Tensor | None, device) -> torch.Tensor:
    """A per-head parameter as a contiguous float32 vector (an empty one when absent)."""
    if x is None:
        return torch.empty(0, dtype=torch.float32, device=device)
    return x.detach().float().contiguous()


def _meta(kernel, head_dim: int, dtype: torch.dtype) -> dict:
    maxd = kernel.max_distance if kernel.bias == "lookup" else 0
    return dict(
        D=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        BIAS=BIAS_CODES[kernel.bias],
        HAS_R2=kernel.r2 is not None, HAS_R3=kernel.r3 is not None,
        HAS_WEIGHT=kernel.has_weight, HAS_WA=kernel.w_a is not None, HAS_WP=kernel.w_p is not None,
        MAXD=maxd,
        # fp32 inputs must not be rounded to TF32 inside tl.dot, or fp32 results drift ~1e-3;
        # half inputs take tl.dot's default.
        PRECISION="ieee" if dtype == torch.float32 else None,
        UPCAST=_INTERPRET and dtype == torch.bfloat16,
    )


class _TritonAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, q0, k0, window, kernel, r1, r2, r3, w_a, w_p, table, row_starts=None):
        B, H, LQ, D = q.shape
        LK = k.shape[2]
        dev = q.device
        fm, fn, bm, bn = block_sizes(D, dev)
        meta = _meta(kernel, D, q.dtype)
        meta["HAS_STARTS"] = row_starts is not None  # padded rows (megatron/attention/mask.py)
        starts = (row_starts.to(device=dev, dtype=torch.int64).contiguous() if row_starts is not None
                  else torch.empty(0, dtype=torch.int64, device=dev))
        params = [_vec(x, dev) for x in (r1, r2, r3, w_a, w_p)]
        lut = torch.empty(0, dtype=torch.float32, device=dev)
        bucket = torch.empty(0, dtype=torch.int32, device=dev)
        if kernel.bias == "lookup":
            with torch.no_grad():
                lut = kernel.lookup_values().to(dev).contiguous()  # (H, max_distance + 1)
        if kernel.learned_table:
            bucket = kernel.bucket_of.to(device=dev, dtype=torch.int32).contiguous()
        # The kernel writes O in fp32: the backward's delta = rowsum(dO * O) then comes from the
        # unrounded output. Computing it from a bf16-rounded O (as FlashAttention does) doubled
        # the error of the positional parameters' gradients in bf16 (their sums cancel heavily;
        # EXACT_PV below is the other half of the same fix).
        out = torch.empty(q.shape, dtype=torch.float32, device=dev)
        lse = torch.empty(B * H, LQ, dtype=torch.float32, device=dev)
        scale = 1.0 / D**0.5
        common = (H, LQ, LK, q0, k0, window or 0, scale)
        grid = (triton.cdiv(LQ, fm), B * H)
        # The backward's delta = rowsum(dO * O) equals sum_j P_ij dP_ij only if O is P @ V for
        # the P the backward recomputes. With P rounded to bf16/fp16 before P @ V (the usual
        # FlashAttention forward) the two differ by ~2^-9 per row; a bias parameter's gradient
        # sums dS over whole rows, where the true values cancel, so that gap became a 6% error
        # in the T5 table's gradient on an H100 (bf16, window 512). When the scheme's parameters
        # need gradients, P @ V is done as hi(P) @ V + lo(P) @ V: P to ~2^-17, one more product.
        exact_pv = q.dtype != torch.float32 and any(ctx.needs_input_grad[7:13])
        attention_fwd_kernel[grid](
            q, k, v, out, lse, *params, lut, starts,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
            *common, BLOCK_M=fm, BLOCK_N=fn, HAS_WINDOW=window is not None, EXACT_PV=exact_pv, **meta)
        ctx.save_for_backward(q, k, v, out, lse, *params, lut, bucket, starts)
        ctx.info = (q0, k0, window, kernel.bias, kernel.table_scale,
                    0 if table is None else table.shape[0], meta, (bm, bn))
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, r1, r2, r3, w_a, w_p, lut, bucket, starts = ctx.saved_tensors
        q0, k0, window, bias_kind, table_scale, num_buckets, meta, (bm, bn) = ctx.info
        B, H, LQ, D = q.shape
        LK = k.shape[2]
        dev = q.device
        do = grad_out.contiguous()
        delta = (out.float() * do.float()).sum(-1).reshape(B * H, LQ)  # rowsum(dO * O)
        dq = torch.empty_like(q, memory_format=torch.contiguous_format)
        dk = torch.empty_like(k, memory_format=torch.contiguous_format)
        dv = torch.empty_like(v, memory_format=torch.contiguous_format)
        n_key_blocks = triton.cdiv(LK, bn)
        nslot = max(8, triton.next_power_of_2(max(num_buckets, 1)))
        part = torch.empty(B * H, n_key_blocks, nslot, dtype=torch.float32, device=dev)
        scale = 1.0 / D**0.5
        common = (H, LQ, LK, q0, k0, window or 0, scale)
        params = (r1, r2, r3, w_a, w_p, lut)
        attention_bwd_dkdv_kernel[(n_key_blocks, B * H)](
            q, k, v, do, lse, delta, dk, dv, part, *params, bucket, starts,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3],
            *dk.stride()[:3], *dv.stride()[:3], *common, n_key_blocks,
            BLOCK_M=bm, BLOCK_N=bn, HAS_WINDOW=window is not None, NSLOT=nslot,
            LUT_GRAD=num_buckets > 0, **meta)
        attention_bwd_dq_kernel[(triton.cdiv(LQ, bm), B * H)](
            q, k, v, do, lse, delta, dq, *params, starts,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3], *dq.stride()[:3],
            *common, BLOCK_M=bm, BLOCK_N=bn, HAS_WINDOW=window is not None, **meta)

        # The deterministic reduction: a plain sum over batch and key blocks, fixed order.
        total = part.view(B, H, n_key_blocks, nslot).sum(dim=(0, 2))  # (H, nslot)
        needs = ctx.needs_input_grad
        grads = [None] * 6  # r1, r2, r3, w_a, w_p, table
        if bias_kind == "lookup":
            if needs[12]:
                grads[5] = (total[:, :num_buckets] * table_scale).t().contiguous()  # (buckets, H)
        else:
            for i, slot in enumerate((0, 1, 2, 3, 4)):
                if needs[7 + i]:
                    grads[i] = total[:, slot].contiguous()
        return (dq, dk, dv, None, None, None, None, *grads, None)


def triton_attention(q, k, v, kernel, q0: int, k0: int, window: int | None = None,
                     row_starts: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention with the DistanceKernel's bias/weight: (B, H, Lq, D) like the reference.
    `row_starts` (B,): padded rows, hidden as megatron/attention/mask.py says (None: no padding)."""
    # The kernels read STARTS[b] for every batch row b: a shorter tensor would be read past its end.
    check_row_starts(row_starts, q.shape[0], values=False)
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        q, k, v = (x.contiguous() for x in (q, k, v))
    # A tabulated lookup (Sandwich) must reach the largest distance here: the last query to the first key.
    t = kernel = kernel.covering(int(q0) + q.shape[2] - 1 - int(k0), q.device)
    table = t.table.float() if t.table is not None else None
    return _TritonAttention.apply(q, k, v, int(q0), int(k0), window, kernel,
                                 t.r1, t.r2, t.r3, t.w_a, t.w_p, table, row_starts)
