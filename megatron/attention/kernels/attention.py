"""Autograd wrapper around the Triton attention kernels: triton_attention(q, k, v, kernel, ...).

Inputs follow the backend contract (megatron/attention/base.py): q (B, H, Lq, D), k/v (B, H_kv, Lk, D)
with unit stride on D (views straight out of the fused QKV projection are fine), positions
consecutive (queries at q0 + i, keys at k0 + j). Grouped-query attention (H_kv < H): the kernels
read key/value head h // (H / H_kv) in place, and the dk/dv kernel sums each group's query heads
in one program (attention_bwd.py). The scheme's DistanceKernel tensors (clamped,
autograd-attached) are autograd inputs, so their gradients flow back to the raw parameters.
Parameter gradients are reduced without atomics: per-key-block partials, then a torch sum (one
per call, or one for all the calls of a forward that share a kernel: share_kernel).
A log/power bias is evaluated per score (inline) or loaded from a per-call table over distance
(kernels/bias_table.py: which one, and why the table's gradients need no per-distance partials);
block sizes, warps and stages come from kernels/tuning.py (cached per GPU, dtype, head dim, length)."""
from __future__ import annotations

import dataclasses
import os

import torch
import triton
from triton.runtime.errors import OutOfResources
from triton.testing import do_bench

from megatron.attention.base import kv_group
from megatron.attention.kernels.attention_bwd import attention_bwd_dkdv_kernel, attention_bwd_dq_kernel
from megatron.attention.kernels.attention_fwd import attention_fwd_kernel
from megatron.attention.kernels.bias_table import BIAS_PARAMS, bias_jacobians, bias_path, bias_table, table_length
from megatron.attention.kernels.distance_bias import BIAS_CODES
from megatron.attention.kernels.tuning import LaunchConfig, Tuner, cache_key
from megatron.attention.mask import check_row_starts
from megatron.positional.distance_kernel import DistanceKernel

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
MAX_DISTANCE = 1 << 23  # kernels/fma_log2.py small_int_to_float: exact for 0 <= d < 2^23


_TUNER = Tuner()  # launch configurations: megatron/attention/kernels/tuning.py


def _gpu_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def _launch(pass_name: str, q, lk: int, run):
    """run(config) for this call's configuration (timed first only when autotuning), on a smaller
    one if the GPU refuses it (tuning.Tuner.run_fitting); returns what run returns."""
    def measure(cfg: LaunchConfig) -> float:
        return do_bench(lambda: run(cfg), warmup=5, rep=25) / 1000.0  # ms -> s

    gpu, length = _gpu_name(q.device), max(q.shape[2], lk)
    cfg = _TUNER.config(pass_name, gpu, q.dtype, q.shape[-1], length, measure=measure, interpreter=_INTERPRET)
    if _INTERPRET:
        return run(cfg)

    key = cache_key(pass_name, gpu, q.dtype, q.shape[-1], length)
    return _TUNER.run_fitting(key, cfg, run, (OutOfResources,))


def _vec(x: torch.Tensor | None, device) -> torch.Tensor:
    """A per-head parameter as a contiguous float32 vector (an empty one when absent)."""
    if x is None:
        return torch.empty(0, dtype=torch.float32, device=device)
    return x.detach().float().contiguous()


def _meta(kernel, head_dim: int, dtype: torch.dtype, table_len: int = 0) -> dict:
    """The launch's constexprs (and MAXD). table_len > 0: the bias is a table over distances
    0..table_len-1 (the table path), read as a lookup; its parameters are not loaded."""
    maxd = kernel.max_distance if kernel.bias == "lookup" else table_len - 1 if table_len else 0
    return dict(
        D=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        BIAS=BIAS_CODES["lookup" if table_len else kernel.bias],
        HAS_R2=kernel.r2 is not None and not table_len, HAS_R3=kernel.r3 is not None and not table_len,
        HAS_WEIGHT=kernel.has_weight, HAS_WA=kernel.w_a is not None, HAS_WP=kernel.w_p is not None,
        MAXD=maxd,
        # fp32 inputs must not be rounded to TF32 inside tl.dot, or fp32 results drift ~1e-3;
        # half inputs take tl.dot's default.
        PRECISION="ieee" if dtype == torch.float32 else None,
        UPCAST=_INTERPRET and dtype == torch.bfloat16,
    )


class _TritonAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, q0, k0, window, kernel, r1, r2, r3, w_a, w_p, table, row_starts=None, shared=None,
                doc_bounds=None):
        B, H, LQ, D = q.shape
        LK = k.shape[2]
        dev = q.device
        group = kv_group(q, k)
        tabulate = bias_path(kernel) == "table"
        n_table = table_length(q0, LQ, k0) if tabulate else 0
        meta = _meta(kernel, D, q.dtype, n_table)
        meta["HAS_STARTS"] = row_starts is not None  # padded rows (megatron/attention/mask.py)
        meta["GROUP"] = group  # query heads per key/value head (a constexpr: 1 compiles as before)
        starts = (row_starts.to(device=dev, dtype=torch.int64).contiguous() if row_starts is not None
                  else torch.empty(0, dtype=torch.int64, device=dev))
        meta["HAS_DOCS"] = doc_bounds is not None  # packed documents: (B, 2, L) starts and ends
        # int32: the kernels' loop bounds and distances are int32 (an int64 bound made the distance
        # int64, which the bias's int-to-float bitcast refuses when compiled; the interpreter allowed it)
        docs = (doc_bounds.to(device=dev, dtype=torch.int32).contiguous() if doc_bounds is not None
                else torch.empty(0, dtype=torch.int32, device=dev))
        params = [_vec(x, dev) for x in (r1, r2, r3, w_a, w_p)]
        lut = torch.empty(0, dtype=torch.float32, device=dev)
        bucket = torch.empty(0, dtype=torch.int32, device=dev)
        if kernel.bias == "lookup":
            with torch.no_grad():
                lut = kernel.lookup_values().to(dev).contiguous()  # (H, max_distance + 1)
        # Table path (kernels/bias_table.py): the bias at every distance of this call, and the
        # names of the bias parameters whose derivative tables the backward will need.
        jac_names = []
        if tabulate:
            lut = bias_table(kernel, n_table, dev)  # (H, n_table)
            jac_names = [name for i, name in enumerate(BIAS_PARAMS)
                         if getattr(kernel, name) is not None and ctx.needs_input_grad[7 + i]]
        if kernel.learned_table:
            bucket = kernel.bucket_of.to(device=dev, dtype=torch.int32).contiguous()
        # The kernel writes O in fp32: the backward's delta = rowsum(dO * O) then comes from the
        # unrounded output. Computing it from a bf16-rounded O (as FlashAttention does) doubled
        # the error of the positional parameters' gradients in bf16 (their sums cancel heavily;
        # EXACT_PV below is the other half of the same fix).
        # (B, H, LQ, D) laid out as (B, LQ, H, D): the caller's merge of the heads, (B, LQ, H * D),
        # is then a view, not a copy of the output in every layer's forward and recomputation.
        out = torch.empty(B, LQ, H, D, dtype=torch.float32, device=dev).transpose(1, 2)
        lse = torch.empty(B * H, LQ, dtype=torch.float32, device=dev)
        scale = 1.0 / D**0.5
        common = (H, LQ, LK, q0, k0, window or 0, scale)
        # The backward's delta = rowsum(dO * O) equals sum_j P_ij dP_ij only if O is P @ V for
        # the P the backward recomputes. With P rounded to bf16/fp16 before P @ V (the usual
        # FlashAttention forward) the two differ by ~2^-9 per row; a bias parameter's gradient
        # sums dS over whole rows, where the true values cancel, so that gap became a 6% error
        # in the T5 table's gradient on an H100 (bf16, window 512). When the scheme's parameters
        # need gradients, P @ V is done as hi(P) @ V + lo(P) @ V: P to ~2^-17, one more product.
        exact_pv = q.dtype != torch.float32 and any(ctx.needs_input_grad[7:13])

        def run(cfg: LaunchConfig) -> None:
            attention_fwd_kernel[(triton.cdiv(LQ, cfg.block_m), B * H)](
                q, k, v, out, lse, *params, lut, starts, docs,
                *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
                *common, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HAS_WINDOW=window is not None,
                EXACT_PV=exact_pv, **meta, **cfg.launch_options())

        _launch("fwd", q, LK, run)
        ctx.save_for_backward(q, k, v, out, lse, *params, lut, bucket, starts, docs)
        ctx.info = (q0, k0, window, kernel.bias, kernel.table_scale,
                    0 if table is None else table.shape[0], meta, jac_names)
        ctx.shared = shared
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, r1, r2, r3, w_a, w_p, lut, bucket, starts, docs = ctx.saved_tensors
        q0, k0, window, bias_kind, table_scale, num_buckets, meta, jac_names = ctx.info
        B, H, LQ, D = q.shape
        LK = k.shape[2]
        dev = q.device
        # The kernels read dO through its strides (unit stride on D): in the output's layout it
        # arrives as the gradient of the heads' merge, and needs no copy.
        do = grad_out if grad_out.stride(-1) == 1 else grad_out.contiguous()
        delta = torch.empty(B * H, LQ, dtype=torch.float32, device=dev)  # rowsum(dO * O), row-major for the kernels
        torch.sum(torch.mul(out, do), -1, out=delta.view(B, H, LQ))  # out is fp32: the product is too
        dq = torch.empty_like(q, memory_format=torch.contiguous_format)
        dk = torch.empty_like(k, memory_format=torch.contiguous_format)
        dv = torch.empty_like(v, memory_format=torch.contiguous_format)
        nslot = max(8, triton.next_power_of_2(max(num_buckets, 1)))
        scale = 1.0 / D**0.5
        common = (H, LQ, LK, q0, k0, window or 0, scale)
        params = (r1, r2, r3, w_a, w_p, lut)
        jac = torch.empty(0, dtype=torch.float32, device=dev)
        if jac_names:  # the table path's derivative tables, from the saved (clamped) parameters
            by_name = {n: (x if x.numel() else None) for n, x in zip(BIAS_PARAMS, (r1, r2, r3))}
            desc = DistanceKernel(bias=bias_kind, **by_name)
            jac = bias_jacobians(desc, jac_names, meta["MAXD"] + 1, dev)  # (len(jac_names), H, n)

        def run(cfg: LaunchConfig) -> torch.Tensor:
            """Both backward kernels with one configuration; the partials (B*H, key blocks, NSLOT)."""
            n_key_blocks = triton.cdiv(LK, cfg.block_n)
            part = torch.empty(B * H, n_key_blocks, nslot, dtype=torch.float32, device=dev)
            blocks = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HAS_WINDOW=window is not None,
                          **meta, **cfg.launch_options())
            # One program per key block and key/value head: it walks its group's query heads
            # (attention_bwd.py), so dk, dv come out (B, H_kv, LK, D) with no buffer per query head.
            attention_bwd_dkdv_kernel[(n_key_blocks, B * (H // meta["GROUP"]))](
                q, k, v, do, lse, delta, dk, dv, part, *params, jac, bucket, starts, docs,
                *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3],
                *dk.stride()[:3], *dv.stride()[:3], *common, n_key_blocks,
                NSLOT=nslot, LUT_GRAD=num_buckets > 0, N_JAC=len(jac_names), **blocks)
            dq_m, dq_n = cfg.dq_blocks()  # the mirror tile (kernels/tuning.py)
            attention_bwd_dq_kernel[(triton.cdiv(LQ, dq_m), B * H)](
                q, k, v, do, lse, delta, dq, *params, starts, docs,
                *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3], *dq.stride()[:3],
                *common, **{**blocks, "BLOCK_M": dq_m, "BLOCK_N": dq_n})
            return part

        part = _launch("bwd", q, LK, run)
        needs = ctx.needs_input_grad[7:13]  # r1, r2, r3, w_a, w_p, table
        grads = [None] * 6
        if any(needs):  # (ALiBi's slopes, Sandwich's tabulated bias: constants, nothing to reduce)
            to_grads = _ParameterGradients(bias_kind, num_buckets, table_scale, jac_names, needs)
            if ctx.shared is not None:  # reduced once with every other layer's (ForwardGradients)
                ctx.shared.add(part.view(B, H, -1, nslot), to_grads)
            else:
                # The deterministic reduction: a plain sum over batch and key blocks, fixed order.
                grads = to_grads(part.view(B, H, -1, nslot).sum(dim=(0, 2)))  # from (H, nslot)
        return (dq, dk, dv, None, None, None, None, *grads, None, None, None)


@dataclasses.dataclass(frozen=True)
class _ParameterGradients:
    """The parameter gradients (r1, r2, r3, w_a, w_p, table) from the partials' total (H, NSLOT)
    (the slots: attention_bwd.py); `needs`: which of the six the caller wants."""

    bias_kind: str
    num_buckets: int
    table_scale: float
    jac_names: list
    needs: tuple

    def __call__(self, total: torch.Tensor) -> list:
        grads = [None] * 6
        if self.bias_kind == "lookup":
            if self.needs[5]:
                grads[5] = (total[:, :self.num_buckets] * self.table_scale).t().contiguous()  # (buckets, H)
            return grads
        # Inline: parameter i's gradient is in slot i. Table path: bias parameter jac_names[k]'s
        # is in slot k (the kernel's k-th derivative table); the weight's stay in slots 3, 4.
        slots = {i: i for i in range(5)}
        if self.jac_names:
            slots.update({BIAS_PARAMS.index(n): k for k, n in enumerate(self.jac_names)})
        for i, slot in slots.items():
            if self.needs[i]:
                grads[i] = total[:, slot].contiguous()
        return grads


_GRAD_NAMES = ("r1", "r2", "r3", "w_a", "w_p", "table")  # the Function's parameter inputs, in order


class ForwardGradients:
    """The scheme parameters' gradient partials of every kernel call of one model forward, summed
    once. The layers of a forward share one DistanceKernel (TritonAttention.prepare builds it
    once, outside the activation-checkpointed layers) whose tensors come out of _SharedTensors:
    each call's backward adds its partials here and returns no gradient for them, and
    _SharedTensors' backward, which autograd runs after every call's (each call is one of its
    consumers), sums them all and hands the parameters one gradient. One layer at a time, the
    same sum costs a reduction, a copy per parameter and an accumulating add per parameter in
    every layer of every step: kernel launches that grow with depth (tests/unit/test_step_ops.py).
    The sum is one reduction over (calls, batch, key blocks): deterministic, in another order
    than one call at a time (the same value up to rounding)."""

    def __init__(self, names: tuple[str, ...]):
        self.names = names  # the shared tensors (of _GRAD_NAMES), in _SharedTensors' order
        self.parts: list[torch.Tensor] = []  # (B, H, key blocks, NSLOT) float32, one per call
        self.to_grads: _ParameterGradients | None = None

    def add(self, part: torch.Tensor, to_grads: _ParameterGradients) -> None:
        if self.to_grads is not None and to_grads != self.to_grads:
            raise AssertionError("calls sharing a positional kernel asked for different parameter gradients")
        self.to_grads = to_grads
        self.parts.append(part)

    def reduce(self) -> list:
        """The six gradients (None where not asked for or where no call added partials), and forget the partials."""
        parts, self.parts = self.parts, []
        if not parts:
            return [None] * 6
        if len(parts) == 1:  # one call: the reduction it does alone, bit for bit
            return self.to_grads(parts[0].sum(dim=(0, 2)))
        total = None
        for shape in dict.fromkeys(p.shape for p in parts):  # one shape unless a launch config fell back
            same = torch.stack([p for p in parts if p.shape == shape])  # (calls, B, H, key blocks, NSLOT)
            part_total = same.sum(dim=(0, 1, 3))
            total = part_total if total is None else total + part_total
        return self.to_grads(total)


class _SharedTensors(torch.autograd.Function):
    """Identity on a kernel's differentiable tensors, once per forward (ForwardGradients)."""

    @staticmethod
    def forward(ctx, shared, *tensors):
        ctx.shared = shared
        ctx.set_materialize_grads(False)
        return tuple(t.view_as(t) for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        reduced = dict(zip(_GRAD_NAMES, ctx.shared.reduce()))
        out = []
        for name, g in zip(ctx.shared.names, grads):  # a gradient from another consumer is added
            r = reduced[name]
            out.append(r if g is None else g if r is None else g + r)
        return (None, *out)


def share_kernel(kernel: DistanceKernel) -> tuple[DistanceKernel, ForwardGradients | None]:
    """`kernel` for every call of one forward, with the ForwardGradients its calls reduce their
    parameter gradients into (None when no tensor of it needs a gradient: nothing to reduce)."""
    tensors = {n: t for n, t in kernel.tensors().items() if t.requires_grad}
    if not tensors or not torch.is_grad_enabled():
        return kernel, None
    shared = ForwardGradients(tuple(tensors))
    outs = _SharedTensors.apply(shared, *tensors.values())
    outs = outs if isinstance(outs, tuple) else (outs,)
    # A learned lookup's values (T5) are rebuilt from the shared table, once here.
    return dataclasses.replace(kernel, **dict(zip(tensors, outs))), shared


def triton_attention(q, k, v, kernel, q0: int, k0: int, window: int | None = None,
                     row_starts: torch.Tensor | None = None, shared: ForwardGradients | None = None,
                     doc_bounds: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention with the DistanceKernel's bias/weight: (B, H, Lq, D) like the reference.
    `row_starts` (B,): padded rows, hidden as megatron/attention/mask.py says (None: no padding).
    `shared`: the ForwardGradients of a kernel from share_kernel (None for any other kernel).
    `doc_bounds` (B, 2, L): packed documents (megatron/attention/documents.py PackedDocuments.bounds),
    queries and keys the same L tokens (q0 = k0); tiles wholly across documents are skipped."""
    # The kernels read STARTS[b] for every batch row b: a shorter tensor would be read past its end.
    check_row_starts(row_starts, q.shape[0], values=False)
    if doc_bounds is not None and (tuple(doc_bounds.shape) != (q.shape[0], 2, q.shape[2]) or k.shape[2] != q.shape[2]
                                   or int(q0) != int(k0) or row_starts is not None):
        raise ValueError(f"packed documents need queries and keys at the same {q.shape[2]} positions, no padded "
                         f"rows and doc_bounds of shape ({q.shape[0]}, 2, {q.shape[2]}); got "
                         f"{tuple(doc_bounds.shape)} with {k.shape[2]} keys, q0 {q0}, k0 {k0}")
    if int(q0) + q.shape[2] - 1 - int(k0) >= MAX_DISTANCE:
        raise ValueError(f"the triton attention kernels take query-key distances below {MAX_DISTANCE} (2^23: "
                         f"they form distances as floats bit by bit); got {int(q0) + q.shape[2] - 1 - int(k0)} "
                         f"(queries from position {q0}, keys from {k0}); use attention-backend sdpa or reference")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        q, k, v = (x.contiguous() for x in (q, k, v))
    # A tabulated lookup (Sandwich) must reach the largest distance here: the last query to the first key.
    t = kernel = kernel.covering(int(q0) + q.shape[2] - 1 - int(k0), q.device)
    table = t.table.float() if t.table is not None else None
    return _TritonAttention.apply(q, k, v, int(q0), int(k0), window, kernel,
                                 t.r1, t.r2, t.r3, t.w_a, t.w_p, table, row_starts, shared, doc_bounds)
