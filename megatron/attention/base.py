"""The interface every attention backend implements.

A backend computes causal (optionally windowed) softmax attention with a positional scheme's
score hooks, in this order (the placement the KERPLE checkpoints depend on):

    scores = (q @ k^T) / sqrt(D)            # q, k already rotated by the caller (rotate_qk)
    scores = scores * weight + bias          # scheme.score_weight / scheme.score_bias, if any
    scores = mask(scores)                    # allowed_mask(q_pos, k_pos, window)
    out    = dropout(softmax(scores)) @ v

Backends register with @register_backend in megatron/attention/registry.py; `priority` orders
the "auto" preference (lower = tried first), so a new backend (flex, triton, flash) is one new
file and no edit elsewhere. A backend whose speed depends on the case (a fused kernel that only
pays off for score-bias schemes, or that runs on CPU only in an interpreter) overrides
`auto_rank` to step aside; an explicit name still gets it whenever unsupported_reason allows.

Grouped-query attention: q has H query heads, k and v H_kv key/value heads (H_kv divides H; 1:
multi-query), never repeated by the caller. Query head h reads key/value head h // (H / H_kv), the
grouping of NeoX and of Hugging Face's repeat_kv; each backend maps the heads itself, without a
(B, H, Lk, D) copy of k and v where its kernel allows (`kv_group` gives the group size). Per-head
positional parameters (the scheme's bias and weight) belong to the QUERY heads.

Whatever depends only on the positions, the window and the scheme (a shared scheme's
[H, Lq, Lk] bias, SDPA's float mask, flex's block mask, the layout checks) is built by
`prepare`, once per model forward (megatron.model.attention.AttentionContext.build), and handed
to every layer's `forward` as `prepared`; a direct call without it prepares for itself.
"""
from __future__ import annotations

import torch

from megatron.attention.mask import check_window


class AttentionBackend:
    name: str = "base"

    priority: int = 1000  # set by @register_backend
    # Whether forward takes `row_starts` (padded batches, megatron/attention/mask.py); a backend
    # that cannot sets False and the resolver never hands it a padded batch.
    takes_padding: bool = True
    # Why it cannot keep attention inside packed documents (megatron/attention/documents.py), or
    # None when forward honours `documents`; the resolver never hands such a batch to one that cannot.
    documents_refusal: str | None = None
    # Why it cannot take positions a training recipe drew (gapped: randomized positions, PoSE), or None.
    sampled_positions_refusal: str | None = None
    # Whether `prepare` may build a bias over positions from the scheme's parameters (a dense
    # bias on their autograd graph, whose gradient summed over layers before its reduction to
    # the parameters would change their bits). A backend whose prepared state is positions, or
    # the per-head parameters themselves, sets False: every layer of a forward then shares it
    # even while KERPLE trains (megatron.model.attention.shares_prepared).
    prepares_from_parameters: bool = True

    def unsupported_reason(self, scheme, device: torch.device, dtype: torch.dtype,
                           training: bool, dropout: bool = False) -> str | None:
        """None when this backend can run `scheme` here, else one sentence saying why not.
        `dropout`: attention-probability dropout will be applied (training with dropout > 0)."""
        return None

    def auto_rank(self, scheme, device: torch.device, dtype: torch.dtype, training: bool) -> int | None:
        """Rank for "auto" among the backends that support the case (lower wins), or None to
        never be picked automatically here. Default: the registered priority."""
        return self.priority

    def prepare(self, scheme, q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None = None,
                row_starts: torch.Tensor | None = None, documents=None):
        """Per-forward state shared by every layer (see the module docstring), or None. It may hold
        tensors on the autograd graph of the scheme's parameters: built once and used by every
        layer, their gradient is the sum over layers, as when each layer built its own. It lives
        as long as the forward's context (and its graph), never longer: nothing is cached here."""
        check_window(window)
        return None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scheme,
                q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None = None,
                softmax_in_fp32: bool = False, dropout_p: float = 0.0, prepared=None,
                row_starts: torch.Tensor | None = None, documents=None) -> torch.Tensor:
        """q: (B, H_local, Lq, D); k, v: (B, H_kv, Lk, D), H_kv dividing H_local (grouped-query
        attention, the module docstring; H_kv = H_local for multi-head); q_pos: (Lq,), k_pos: (Lk,) int64
        absolute positions, or (B, Lq), (B, Lk): each row its own (a training recipe's draw, only
        for a backend without a sampled_positions_refusal). Returns (B, H_local, Lq, D). dropout_p is applied as given (the
        caller passes 0 in eval). `prepared`: this backend's prepare(scheme, q_pos, k_pos, window)
        for these positions, or None to prepare here. `row_starts` (B,): padded rows, hidden as
        megatron.attention.mask.allowed_mask says (None: no padding); pass the same to prepare.
        `documents`: a megatron.attention.documents.PackedDocuments (queries and keys the same L
        tokens): no query sees another document's keys; None: one sequence per row."""
        raise NotImplementedError


def partitioned(scheme) -> bool:
    """Whether the scheme's parameters are partitioned (ZeRO-3: they carry `ds_id`): gathered
    only inside the layers' forward, so nothing prepared outside the layers may read them."""
    return any(hasattr(p, "ds_id") for p in scheme.parameters())


def kv_group(q: torch.Tensor, k: torch.Tensor) -> int:
    """Query heads per key/value head, H / H_kv, for q (B, H, Lq, D) and k (B, H_kv, Lk, D): query
    head h reads key/value head h // kv_group(q, k) (the module docstring)."""
    heads, kv_heads = q.shape[1], k.shape[1]
    if kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"grouped-query attention needs key/value heads dividing the query heads; got {heads} "
                         f"query heads and {kv_heads} key/value heads")
    return heads // kv_heads


def repeat_kv(x: torch.Tensor, group: int) -> torch.Tensor:
    """(B, H_kv, L, D) -> (B, H_kv * group, L, D): each key/value head repeated for its group's query
    heads (head h of the result is head h // group of x). A copy: only for the backends that must
    materialise the grouping (the reference, read top to bottom)."""
    return x if group == 1 else x.repeat_interleave(group, dim=1)
