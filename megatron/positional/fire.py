"""FIRE, Functional Interpolation for Relative Positions (Li et al., ICLR 2024, arXiv 2310.04418).

    b_h(i, j) = f_theta( psi(i - j) / psi(max(L, i)) )_h,     psi(x) = log(c * x + 1)

f_theta: R -> R^H is a small MLP shared by all heads up to its output layer (Linear(1, width),
ReLU, Linear(width, H); width 32 in the paper). c > 0 and the threshold L are learned. Unlike
every other score bias here, the bias depends on the QUERY position i through the "progressive
interpolation" denominator psi(max(L, i)): the normalised distance lies in [0, 1] at any length,
which is what FIRE relies on to extrapolate; L keeps short prefixes from being over-stretched.

Parametrisation and initialisation follow the paper's PyTorch listing (its appendix; the same code
is public, e.g. github.com/mcleish7/arithmetic cramming/architectures/embeddings.py class FIRE):
c starts at 0.1 and enters as |c|; L = |L_multiplier| * init_L with init_L = 512 fixed and the
multiplier learned from 1.0; eps = 1e-6 is added to the denominator; nn.Linear's default init.
Here c, init_L and the width are config keys (fire-init-c, fire-init-threshold, fire-mlp-width).
Positions i, j are the absolute 0-based token indices, as in that listing. One FIRE instance is
shared by all layers, as every scheme of this stack (the paper's listing is one module per layer).

Not a DistanceKernel (fused_kernel() is None): the bias is not a function of i - j alone, so the
fused backends (triton, flex, flash) refuse it through the usual resolver and `auto` takes SDPA.
The dense [H_local, Lq, Lk] float32 bias costs 4*H*Lq*Lk bytes (reference and SDPA materialise
it anyway); the MLP's hidden [rows, Lk, width] activation is evaluated in blocks of query rows so
that, without autograd (evaluation), it never exceeds HIDDEN_BLOCK_ELEMENTS.

Tensor parallelism: the output layer is per head, so a rank holds its heads' rows (drawn for all H
then sliced: TP=2 starts like TP=1). The hidden layer, c and the threshold multiplier are
replicated but feed only this rank's heads, so their gradient must be summed over the TP group:
megatron/parallel/plan.py sets `replicated_grad_sync` (megatron.parallel.layers.copy_to_tp) on the scheme."""
from __future__ import annotations

import torch
from torch import nn

from .base import PositionalScheme, PositionalSpec, summary_stats
from .options import Option
from .registry import register

EPS = 1e-6  # added to psi(max(L, i)), as in the paper's code
# Largest (query rows x keys x width) hidden block evaluated at once: 2**24 floats = 64 MiB.
HIDDEN_BLOCK_ELEMENTS = 1 << 24


@register("fire")
class FIRE(PositionalScheme):
    shift_invariant = False  # psi(max(L, i)) depends on the query position i
    head_dims = {"out_weight": 0, "out_bias": 0}  # the output layer's rows; the rest feeds every head
    options = (
        Option("fire_mlp_width", int, 32, "Hidden width of FIRE's MLP f_theta (pos-emb fire; 32 in the paper).", ge=1),
        Option("fire_init_c", float, 0.1, "Initial value of FIRE's learned log-transform scale c in "
               "psi(x) = log(c*x + 1) (pos-emb fire; 0.1 in the paper).", gt=0),
        Option("fire_init_threshold", float, 512.0, "FIRE's threshold L in psi(max(L, i)) is this value times a "
               "learned multiplier starting at 1 (pos-emb fire; 512 in the paper).", gt=0))

    def __init__(self, spec: PositionalSpec):
        super().__init__(spec)
        width = int(self.option("fire_mlp_width"))
        self.init_threshold = float(self.option("fire_init_threshold"))
        hidden = nn.Linear(1, width)
        out = nn.Linear(width, spec.num_heads)  # all H heads drawn, then this rank's rows kept
        self.hidden_weight = nn.Parameter(hidden.weight.detach().clone())  # (width, 1)
        self.hidden_bias = nn.Parameter(hidden.bias.detach().clone())  # (width,)
        self.out_weight = nn.Parameter(out.weight.detach()[spec.head_slice].clone())  # (H_local, width)
        self.out_bias = nn.Parameter(out.bias.detach()[spec.head_slice].clone())  # (H_local,)
        # Shape (1,), not 0-d: DeepSpeed's parameter broadcast views every parameter as bytes.
        self.c = nn.Parameter(torch.tensor([float(self.option("fire_init_c"))]))
        self.threshold_multiplier = nn.Parameter(torch.tensor([1.0]))
        # Identity, or under TP: identity forward, gradient all-reduced over the TP group.
        self.__dict__["replicated_grad_sync"] = None

    def fused_kernel(self):
        return None  # query-dependent: no DistanceKernel expresses it (see the module docstring)

    @property
    def has_score_bias(self) -> bool:
        return True

    @property
    def has_score_weight(self) -> bool:
        return False

    def _shared(self) -> tuple[torch.Tensor, ...]:
        """(hidden_weight, hidden_bias, |c|, L) in float32, through the TP gradient sync."""
        sync = self.__dict__.get("replicated_grad_sync") or (lambda x: x)
        w1, b1, c, mult = (sync(p.float()) for p in (self.hidden_weight, self.hidden_bias, self.c,
                                                      self.threshold_multiplier))
        return w1[:, 0], b1, c.abs(), mult.abs() * self.init_threshold

    def normalized_distance(self, q_pos: torch.Tensor, k_pos: torch.Tensor, shared=None) -> torch.Tensor:
        """psi(max(i - j, 0)) / (psi(max(L, i)) + eps): (Lq, Lk) float32 in [0, 1] for j <= i.
        The distance is clamped at 0 on the masked upper triangle so everything stays finite."""
        _, _, c, threshold = shared or self._shared()
        i = q_pos.to(torch.float32)
        d = (i[:, None] - k_pos.to(torch.float32)[None, :]).clamp_min(0.0)
        denom = torch.log1p(c * torch.maximum(i, threshold)) + EPS  # (Lq,)
        return torch.log1p(c * d) / denom[:, None]

    def score_bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """(H_local, Lq, Lk) float32: the MLP applied to the normalised distance."""
        shared = self._shared()  # once per call: each replicated parameter synced once
        x = self.normalized_distance(q_pos, k_pos, shared)  # (Lq, Lk)
        w1, b1, _, _ = shared
        w2, b2 = self.out_weight.float(), self.out_bias.float()
        lk = x.shape[1]
        rows = max(1, HIDDEN_BLOCK_ELEMENTS // max(1, lk * w1.numel()))
        out = []
        for blk in x.split(rows, dim=0):
            # Hidden units as rows, scores as columns: one (H, width) x (width, n) GEMM lands in
            # the output layout (2x faster on CPU than (n, width) @ (width, H) then a permute).
            hidden = torch.addcmul(b1[:, None], w1[:, None], blk.reshape(1, -1)).relu_()  # (width, n)
            out.append(torch.addmm(b2[:, None], w2, hidden).view(-1, blk.shape[0], lk))  # (H, rows, Lk)
        return torch.cat(out, dim=1)

    def stats(self) -> dict[str, float]:
        """|c|, the threshold L, and per head the norm of its output row (how strongly each head
        uses position), logged every step."""
        with torch.no_grad():
            _, _, c, threshold = self._shared()
            out = {"fire_c": c.item(), "fire_threshold": threshold.item()}
            out.update(summary_stats("fire_head_norm", self.out_weight.float().norm(dim=1)))
        return out
