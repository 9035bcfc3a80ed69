"""The contract every positional scheme implements.

A scheme is one nn.Module instance shared by all layers (as in the KERPLE paper). The attention
core calls the same four hooks on every scheme and never compares scheme names:

    embed(positions)             -> [L, hidden] added to token embeddings, or None
    rotate_qk(q, k, q_pos, k_pos) -> (q, k) rotated, or unchanged
    score_bias(q_pos, k_pos)     -> [H_local, Lq, Lk] float32 added to the scaled scores, or None
    score_weight(q_pos, k_pos)   -> [H_local, Lq, Lk] float32 multiplying the scaled scores, or None
    (embed, rotate_qk and query_scale also take (B, L) positions, each row at its own: training's
    drawn positions; batch_score_bias / batch_score_weight call the two score hooks per row.)
    query_scale(q_pos, window)   -> [Lq] float32 multiplying query i's q.k/sqrt(d), or None: log-n
                                    scaling (logn.py), a model switch every scheme inherits

The bias is added AFTER the 1/sqrt(head_dim) scaling and before mask/softmax (the placement
the paper's released checkpoints depend on). Positions are absolute int64 token indices, so the
same hooks serve training, evaluation at any length and kv-cache decoding (q_pos = the new rows).
For causal attention only j <= i matters; schemes must nevertheless return finite values on the
masked upper triangle (distances are clamped at 0) so gradients through the mask stay NaN-free.

Tensor parallelism: heads are split contiguously; rank r owns heads [r*H/tp, (r+1)*H/tp). A
scheme declares which of its tensors hold one entry per head, and along which dim (`head_dims`);
every other tensor is whole on every rank. The model always builds the scheme whole;
megatron/parallel/plan.py builds a rank's copy with (tp_rank, tp_size) (holding ONLY its own heads:
per-head constants such as sandwich's come from the spec) and loads it with the whole scheme's
slices, so TP=2 and TP=1 start identical. A scheme with replicated parameters that feed only its
own heads (FIRE's shared MLP layer) sets the instance attribute `replicated_grad_sync` (None) and
passes them through it: under TP the plan puts copy_to_tp there (identity forward, gradient summed
over the TP group), so every rank sees the TP=1 gradient.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
from torch import nn

from .distance import causal_distance, largest_distance
from .distance_kernel import DistanceKernel
from .logn import logn_scale
from .options import Option


@dataclass(frozen=True)
class PositionalSpec:
    """Everything a scheme may need to build itself (taken from the model config)."""

    num_heads: int  # global number of attention heads
    head_dim: int
    hidden_size: int
    max_position_embeddings: int
    tp_rank: int = 0
    tp_size: int = 1
    init_method_std: float = 0.02
    # Every model config key (name with underscores -> value): a scheme's own hyperparameters are
    # declared in its `options` (options.py) and read with scheme.option(name); the HF export
    # carries them.
    options: dict = field(default_factory=dict, compare=False)

    @property
    def local_heads(self) -> int:
        return self.num_heads // self.tp_size

    @property
    def head_slice(self) -> slice:
        n = self.local_heads
        return slice(self.tp_rank * n, (self.tp_rank + 1) * n)


class PositionalScheme(nn.Module):
    """Base class: every hook is a no-op; a scheme overrides the ones it uses.

    A scheme whose bias/weight is a function of distance states only its parameters, their
    `clamps` and its `fused_kernel()` description; score_bias, score_weight, has_score_bias,
    has_score_weight and stats are derived here from that one description."""

    name: str = "base"
    # The scheme's own config keys (options.py): declared once here, composed into the model config.
    options: tuple[Option, ...] = ()
    # Tensor name -> the dim holding its heads, for every tensor with one entry per head (a
    # tensor-parallel rank holds only its heads' entries); any tensor not named is whole on every rank.
    head_dims: dict[str, int] = {}
    # True when the scheme is meant to be evaluated beyond the train length.
    extrapolates: bool = True
    # Parameter name -> (min, max) domain, enforced at forward time by a straight-through clamp
    # (None: unbounded). `clamped()` applies it; `stats()` logs the clamped values, `raw_stats()`
    # the stored ones; with pos-clamp: projected the trainer also clamps the stored values after
    # every optimizer step (`clamped_parameters()`).
    clamps: dict[str, tuple[float | None, float | None]] = {}

    # False when the bias depends on the query position i, not on i - j alone (FIRE): the learned
    # kernel plot then shows it at several query positions.
    shift_invariant: bool = True
    # True when rotate_qk depends on every position of the call (xPos scales relative to the call's
    # centre): a kv-cache then keeps this scheme's keys unrotated and each call rotates all of them.
    rotate_after_cache: bool = False

    def max_query_span(self, dtype) -> int | None:
        """The most positions one rotate_qk call's queries may span in `dtype` (None: any). A
        scheme whose rotation scales q and k (xPos) overflows beyond it; the attention then runs
        in query blocks of this span (megatron/attention/mask.py: query_blocks)."""
        return None

    # Upper bound on the sequence length the scheme can represent (None = any length).
    def max_length(self) -> int | None:
        return None

    def __init__(self, spec: PositionalSpec):
        super().__init__()
        self.spec = spec

    @classmethod
    def option_problems(cls, values: dict) -> list[tuple[str, str]]:
        """(key, what is wrong) for rules between this class's own options, given every model
        config key's value; the model config's check runs each class's rules once."""
        return []

    def option(self, name: str):
        """The value of one of this scheme's declared options (the spec's, else the default)."""
        for opt in type(self).options:
            if opt.name == name:
                return opt.read(self.spec.options)
        raise KeyError(f"{type(self).__name__} declares no option {name!r}")

    def embed(self, positions: torch.Tensor) -> torch.Tensor | None:
        return None

    def rotate_qk(self, q, k, q_pos, k_pos):
        # q: (B, H, Lq, D), k: (B, H, Lk, D)
        return q, k

    def fused_kernel(self) -> DistanceKernel | None:
        """The scheme's bias/weight as a DistanceKernel (distance_kernel.py): the one description
        of its formula. None only for a scheme that overrides score_bias/score_weight itself
        (and has_score_bias/has_score_weight): the fused backends then refuse it."""
        return DistanceKernel.plain()

    @property
    def has_score_bias(self) -> bool:
        return self._hook_flags()[0]

    @property
    def has_score_weight(self) -> bool:
        return self._hook_flags()[1]

    def _hook_flags(self) -> tuple[bool, bool]:
        """(bias?, weight?) read off the description once: which hooks a scheme has is fixed at
        construction, and backends ask on every forward."""
        flags = self.__dict__.get("_hook_flags_cache")
        if flags is None:
            with torch.no_grad():
                kernel = self.fused_kernel()
            flags = (kernel is not None and kernel.bias != "none", kernel is not None and kernel.has_weight)
            self.__dict__["_hook_flags_cache"] = flags
        return flags

    def score_bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        kernel = self.fused_kernel()
        if kernel is None:
            return None
        return kernel.bias_at(causal_distance(q_pos, k_pos), largest=largest_distance(q_pos, k_pos))

    def score_weight(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        kernel = self.fused_kernel()
        return None if kernel is None else kernel.weight_at(causal_distance(q_pos, k_pos))

    def batch_score_bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor,
                         row_starts: torch.Tensor | None = None,
                         doc_positions: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor | None:
        """score_bias for a batch whose rows may be left-padded (megatron/attention/mask.py): (H,
        Lq, Lk), shared by every row, unless the scheme depends on absolute positions
        (shift_invariant False: FIRE) and rows start at different positions; then (B, H, Lq, Lk),
        each row at its own positions (position - row start). `doc_positions` ((B, Lq), (B, Lk)):
        packed documents whose positions restart (reset-position-ids), each query's and key's
        position within its document; such a scheme then sees those, per row (a relative one needs
        nothing: within a document i - j is the same from either origin, and other documents are masked)."""
        return _per_row(self.score_bias, self.shift_invariant, q_pos, k_pos, row_starts, doc_positions)

    def batch_score_weight(self, q_pos: torch.Tensor, k_pos: torch.Tensor,
                           row_starts: torch.Tensor | None = None,
                           doc_positions: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor | None:
        """score_weight for a batch, as batch_score_bias."""
        return _per_row(self.score_weight, self.shift_invariant, q_pos, k_pos, row_starts, doc_positions)

    def query_scale(self, q_pos: torch.Tensor, window: int | None = None) -> torch.Tensor | None:
        """Per-query multipliers of q.k/sqrt(d) (before the weight and bias), or None: log-n
        scaling when the model config's attention-logn-scaling is on (logn.py), for any scheme."""
        options = self.spec.options
        if not options.get("attention_logn_scaling"):
            return None
        return logn_scale(q_pos, options["seq_length"], window, bool(options.get("attention_logn_everywhere")))

    def clamped(self) -> dict[str, torch.Tensor]:
        """Every parameter named in `clamps` that exists, float32, clamped into its domain."""
        out = {}
        for name, (lo, hi) in self.clamps.items():
            x = getattr(self, name, None)
            if x is not None:
                out[name] = clamp_straight_through(x.float(), min=lo, max=hi)
        return out

    def stats(self) -> dict[str, float]:
        """Scalars logged every step (the paper logs bias_p_mean, bias_p_std, ... for KERPLE)."""
        return read_at_once(self.stat_tensors())

    def stat_tensors(self) -> dict[str, torch.Tensor]:
        """stats() as 0-d tensors, not yet read: the trainer reads a step's logged values with one
        host read. A scheme that overrides stats() itself (FIRE) has read its values there; they
        are handed on here as host tensors."""
        if type(self).stats is not PositionalScheme.stats:
            return {k: torch.tensor(v, dtype=torch.float64) for k, v in self.stats().items()}
        out = {}
        for name, value in self.clamped().items():
            out.update(summary_tensors(name, value))
        return out

    def raw_stats(self) -> dict[str, float]:
        """The stored, unclamped values of the clamped parameters ({name}_raw_mean, ..._min). Under
        the straight-through clamp a parameter the optimizer pushes below its floor stays there
        while the forward (and `stats()`) sees the floor: only these show it."""
        return read_at_once(self.raw_stat_tensors())

    def raw_stat_tensors(self) -> dict[str, torch.Tensor]:
        """raw_stats() as 0-d tensors, not yet read (as stat_tensors)."""
        out = {}
        for name in self.clamps:
            x = getattr(self, name, None)
            if x is not None:
                out.update(summary_tensors(f"{name}_raw", x))
        return out

    def per_head_stats(self) -> dict[str, float]:
        """Each head's clamped value of every clamped parameter ({name}_h{i}), for the per-head
        trajectories that show whether a learned kernel has stopped drifting (the summary stats
        average heads moving in opposite directions away)."""
        return read_at_once(self.per_head_tensors())

    def per_head_tensors(self) -> dict[str, torch.Tensor]:
        """per_head_stats() as 0-d tensors, not yet read (as stat_tensors)."""
        out = {}
        for name, value in self.clamped().items():
            out.update({head_key(name, i): v for i, v in enumerate(value.detach().flatten().unbind())})
        return out

    def clamped_parameters(self) -> list[tuple[nn.Parameter, float | None, float | None]]:
        """(parameter, min, max) for every trainable parameter with a domain: what pos-clamp:
        projected clamps in place after each optimizer step."""
        out = []
        for name, (lo, hi) in self.clamps.items():
            x = getattr(self, name, None)
            if isinstance(x, nn.Parameter) and x.requires_grad:
                out.append((x, lo, hi))
        return out


def _per_row(hook, shift_invariant: bool, q_pos, k_pos, row_starts, doc_positions=None):
    """hook(q_pos, k_pos) once when every row sees the same values, else stacked per row at the
    row's own positions (one evaluation per distinct start, per row of doc_positions: the queries'
    and the keys' positions within their documents, or per row of (B, L) positions: rows at their
    own drawn positions, whose distances differ row to row for every scheme)."""
    if doc_positions is not None and not shift_invariant:
        rows = [hook(q_row, k_row) for q_row, k_row in zip(*doc_positions)]
        return None if rows[0] is None else torch.stack(rows)  # (B, H, Lq, Lk)
    if q_pos.dim() == 2:
        shifts = row_starts.tolist() if row_starts is not None and not shift_invariant else [0] * q_pos.shape[0]
        rows = [hook(q_pos[b] - s, (k_pos[b] if k_pos.dim() == 2 else k_pos) - s) for b, s in enumerate(shifts)]
        return None if rows[0] is None else torch.stack(rows)  # (B, H, Lq, Lk)
    if shift_invariant or row_starts is None:
        return hook(q_pos, k_pos)
    by_start = {}
    for s in row_starts.tolist():
        if s not in by_start:
            by_start[s] = hook(q_pos - s, k_pos - s)
    rows = [by_start[s] for s in row_starts.tolist()]
    return None if rows[0] is None else torch.stack(rows)  # (B, H, Lq, Lk)


def positional_spec(model_cfg) -> PositionalSpec:
    """The whole model's scheme spec from its model config (every head: megatron/parallel/plan.py
    makes a rank's). Here, beside the spec, so the config's size check and the model read one rule."""
    return PositionalSpec(
        num_heads=model_cfg.num_attention_heads,
        head_dim=model_cfg.hidden_size // model_cfg.num_attention_heads,
        hidden_size=model_cfg.hidden_size,
        max_position_embeddings=model_cfg.max_position_embeddings or model_cfg.seq_length,
        init_method_std=model_cfg.init_method_std,
        options=config_options(model_cfg),
    )


def config_options(model_config) -> dict:
    """PositionalSpec.options for a ModelConfig dataclass: every field with a plain JSON value."""
    values = {f.name: getattr(model_config, f.name) for f in dataclasses.fields(model_config)}
    return {k: v for k, v in values.items() if v is None or isinstance(v, (bool, int, float, str))}


def clamp_straight_through(x: torch.Tensor, min: float | None = None, max: float | None = None):
    """Forward uses clamp(x); backward passes the gradient straight through as identity.

    This is what the paper's code does by clamping `.data` outside autograd, but without
    mutating the stored parameter (so optimizer state and checkpoints see the raw value)."""
    return x + (x.clamp(min=min, max=max) - x).detach()


def head_key(name: str, head: int) -> str:
    """The logged name of one head's value of a parameter (per_head_stats): bias_p_h3."""
    return f"{name}_h{head}"


def parse_head_key(key: str) -> tuple[str, int] | None:
    """(parameter name, head) of a head_key, None for any other metric name."""
    stem, sep, idx = key.rpartition("_h")
    return (stem, int(idx)) if sep and stem and idx.isdigit() else None


def summary_stats(name: str, x: torch.Tensor) -> dict[str, float]:
    """{name_mean, name_std, name_max, name_min} over the heads, as python floats (paper's keys),
    read with one host read.

    std is the unbiased estimate like torch's default; with a single head it is reported as 0."""
    return read_at_once(summary_tensors(name, x))


def read_at_once(tensors: dict[str, torch.Tensor]) -> dict[str, float]:
    """{name: value} of 0-d tensors of one device and dtype, with one host read (a read of a GPU
    value waits for the device's queue: one per value was 18 for KERPLE's statistics). The same
    values as reading each alone. (megatron/host_reads.py reads any mix; this file ships in the
    Hugging Face export without the megatron package, so it cannot import that one.)"""
    return dict(zip(tensors, torch.stack(list(tensors.values())).tolist())) if tensors else {}


def summary_tensors(name: str, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """summary_stats as 0-d float32 tensors on x's device, not yet read."""
    x = x.detach().float().flatten()
    std = x.std() if x.numel() > 1 else x.new_zeros(())
    return {f"{name}_mean": x.mean(), f"{name}_std": std, f"{name}_max": x.max(), f"{name}_min": x.min()}
