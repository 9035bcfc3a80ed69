"""The table path of the Triton kernels: a bias that depends on the distance alone (kind log or
power), tabulated once per call as T[h, d] = f_h(d) for d = 0..n-1 and loaded per score, instead
of evaluated per score (log1p for KERPLE-log, exp(p * log d) for a power with an exponent: one or
two transcendentals per score on top of the softmax's exp).

T comes from the scheme's description (DistanceKernel.bias_at, the one home of the formula): no
formula is restated here. The kernels read it as they read a Sandwich table (bias kind lookup).

Parameter gradients: d loss / d theta_k[h] = sum over scores of dS * dT[h, d] / d theta_k[h]. The
derivative tables J[k, h, d] come from autograd through the same description (one table per
parameter that needs a gradient), and the backward kernel contracts dS with them tile by tile.
Why not per-distance sums dT[h, d] (sum of dS over the diagonal i - j = d) followed by the table's
autograd: every key-block program of the backward sees (almost) every diagonal, so per-distance
partials cost O(L^2 / BLOCK_N) memory before a fixed-order sum, or atomics whose order varies.
Contracting inside each program is the same chain rule (sum_d dT[d] * J[d] = sum_ij dS_ij J[d_ij]),
keeps the existing (B*H, key blocks, slots) partials (O(L) memory with the [3, H, L] tables) and
stays bitwise reproducible.

Selection: `KERPLE_TRITON_BIAS` = auto (default) | table | inline. auto is inline for every bias:
on one H200 (2026-11-27, bf16, head dim 64, L = 2048) KERPLE-log's forward took 2.56 ms on the
table path and 1.07 ms inline, though the table's inner loop has fewer instructions (748 against
1,132 on near tiles, tools/sass_mix.py): its per-score gathers cost more than a log computed on
the FMA pipe (kernels/fma_log2.py; on tiles far from the diagonal a 5-FMA series,
kernels/distance_bias.py FAR_U). A learned exponent (kerple_log_3para, power with an exponent)
adds a MUFU exp2 and log2 per score inline (52 MUFU per tile against the softmax's 34): fewer
issue slots than the gathers the table needs, so it follows KERPLE-log (inferred from that
measurement; the next GPU check times both paths for kerple_power_ap_). Lookup biases (T5,
Sandwich) are tables already; a score weight (bias+wht) is always evaluated inline."""
from __future__ import annotations

import dataclasses
import os

import torch

ENV = "KERPLE_TRITON_BIAS"
CHOICES = ("auto", "table", "inline")
TABULATED_KINDS = ("log", "power")
BIAS_PARAMS = ("r1", "r2", "r3")  # the bias's per-head tensors, in kernel slot order


def bias_path(kernel, choice: str | None = None) -> str:
    """'table' or 'inline' for this DistanceKernel; `choice` (default: $KERPLE_TRITON_BIAS or auto)."""
    choice = choice or os.environ.get(ENV) or "auto"
    if choice not in CHOICES:
        raise ValueError(f"{ENV}={choice!r}: expected one of {', '.join(CHOICES)}")
    if kernel.bias not in TABULATED_KINDS:
        return "inline"  # none: nothing to tabulate; lookup: a table already
    if choice == "auto":
        return "inline"  # the module docstring: measured for KERPLE-log, inferred for an exponent
    return choice


def table_length(q0: int, lq: int, k0: int) -> int:
    """Distances a call needs: 0 .. (last query - first key)."""
    return max(q0 + lq - 1 - k0, 0) + 1


def bias_table(kernel, n: int, device: torch.device) -> torch.Tensor:
    """(H, n) float32: the bias at d = 0..n-1, from the description, detached."""
    d = torch.arange(n, dtype=torch.float32, device=device).view(1, n)
    with torch.no_grad():
        return _table(kernel, d).contiguous()


def _table(kernel, d: torch.Tensor) -> torch.Tensor:
    return kernel.bias_at(d)[:, 0, :]  # (H, 1, n) -> (H, n)


def bias_jacobians(kernel, names: list[str], n: int, device: torch.device) -> torch.Tensor:
    """(len(names), H, n) float32: d T[h, d] / d kernel.<name>[h] for each name (of BIAS_PARAMS).

    The description's per-score form (bias_at(d, h) indexes each parameter by head) is evaluated
    at every (h, d) with its own copy of each parameter, so one reverse pass gives each copy's
    derivative: the whole [H, n] derivative table of every parameter at once."""
    heads = next(getattr(kernel, x) for x in BIAS_PARAMS if getattr(kernel, x) is not None).shape[0]
    d = torch.arange(n, dtype=torch.float32, device=device).repeat(heads)  # (H * n,): row h is d = 0..n-1
    copies = torch.arange(heads * n, device=device)  # score (h, d) reads copy h * n + d
    with torch.enable_grad():  # the autograd backward that calls this runs without grad mode
        copy = {name: getattr(kernel, name).detach().float().repeat_interleave(n).requires_grad_(name in names)
                for name in BIAS_PARAMS if getattr(kernel, name) is not None}
        leaves = {name: copy[name] for name in names}
        table = dataclasses.replace(kernel, **copy).bias_at(d, copies)  # (H * n,)
        grads = torch.autograd.grad(table.sum(), [leaves[name] for name in names])
    return torch.stack(grads).view(len(names), heads, n)
