"""The NeoX GPT: embedding (+ absolute positions) -> N pre-LN layers -> final norm -> output layer.

One positional scheme instance (`self.position`) is shared by every layer, as in the KERPLE
paper: its parameters exist once in the optimizer, and their gradient is the sum over layers.

Tensor parallelism (`parallel` with tp_size > 1): heads, MLP features and the vocabulary are
split contiguously over TP ranks (megatron/model/linear.py); the positional scheme holds only
this rank's heads; the loss is megatron-core's vocab-parallel cross entropy. Every TP layout built
from the same seed starts from the same full weights, and tp_size 1 is the plain model.
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from megatron.attention.mask import check_row_starts, row_positions
from megatron.model.attention import AttentionContext, cached_backend
from megatron.model.init import build_init
from megatron.model.linear import (
    column_parallel,
    gather_logits,
    parallel_logits,
    token_cross_entropy,
    vocab_parallel_embedding,
)
from megatron.model.loss import masked_mean
from megatron.model.norms import build_norm
from megatron.model.transformer import TransformerLayer
from megatron.parallel.positional_shards import tag_scheme
from megatron.positional.base import PositionalSpec, config_options
from megatron.positional.registry import build_scheme


def positional_spec(model_cfg, tp_rank: int = 0, tp_size: int = 1) -> PositionalSpec:
    return PositionalSpec(
        num_heads=model_cfg.num_attention_heads,
        head_dim=model_cfg.hidden_size // model_cfg.num_attention_heads,
        hidden_size=model_cfg.hidden_size,
        max_position_embeddings=model_cfg.max_position_embeddings or model_cfg.seq_length,
        rotary_pct=model_cfg.rotary_pct,
        rotary_emb_base=model_cfg.rotary_emb_base,
        rpe_num_buckets=model_cfg.rpe_num_buckets,
        rpe_max_distance=model_cfg.rpe_max_distance,
        tp_rank=tp_rank,
        tp_size=tp_size,
        init_method_std=model_cfg.init_method_std,
        options=config_options(model_cfg),
    )


class GPTModel(nn.Module):
    def __init__(self, model_cfg, vocab_size: int, checkpoint_activations: bool = False, parallel=None):
        super().__init__()
        self.model_cfg = model_cfg
        self.vocab_size = vocab_size
        self.checkpoint_activations = checkpoint_activations
        self.parallel = parallel  # a megatron.parallel.ParallelContext, or None (one rank)
        tp_rank, tp_size = (parallel.tp_rank, parallel.tp_size) if parallel is not None else (0, 1)
        L, h = model_cfg.num_layers, model_cfg.hidden_size
        init = build_init(model_cfg.init_method, model_cfg.init_method_std, L, h)
        out_init = build_init(model_cfg.output_layer_init_method, model_cfg.init_method_std, L, h)

        emb = nn.Embedding(vocab_size, h)
        init(emb.weight)
        self.word_embeddings = vocab_parallel_embedding(emb, parallel)
        spec = positional_spec(model_cfg, tp_rank, tp_size)
        self.position = build_scheme(model_cfg.pos_emb, spec)
        tag_scheme(self.position, model_cfg.pos_emb, spec.options)  # its split dims, for the checkpoint merge
        self.embedding_dropout = nn.Dropout(model_cfg.hidden_dropout)
        self.layers = nn.ModuleList(TransformerLayer(model_cfg, init, out_init, parallel) for _ in range(L))
        self.final_norm = build_norm(model_cfg, h)
        if model_cfg.no_weight_tying:
            out = nn.Linear(h, vocab_size, bias=False)
            init(out.weight)
            self.output_layer = column_parallel(out, parallel)  # vocab split, like the embedding
        else:
            self.output_layer = None  # logits use word_embeddings.weight
        if tp_size > 1:
            mark_positional_parallel(self.position)
            share_replicated_grads(self.position, parallel)
        self._backends: dict = {}

    # ---- pieces ------------------------------------------------------------------------------
    def backend(self, device: torch.device, dtype: torch.dtype):
        """The attention backend for this (device, dtype, mode), resolved once and cached."""
        return cached_backend(self._backends, self.model_cfg, self.position, device, dtype, self.training)

    def position_stats(self) -> dict[str, float]:
        """The scheme's logged statistics over ALL heads (a collective under TP: see full_position)."""
        return self.full_position().stats()

    def full_position(self):
        """The positional scheme with ALL heads: under TP a rank holds only its own heads, so they
        are gathered first (a collective, call it on every rank)."""
        if self.parallel is None or not self.parallel.is_tensor_parallel:
            return self.position
        from megatron.parallel.positional_shards import gather_full_scheme

        return gather_full_scheme(self.position, positional_spec(self.model_cfg), self.model_cfg.pos_emb, self.parallel)

    def output_weight(self) -> torch.Tensor:
        return self.word_embeddings.weight if self.output_layer is None else self.output_layer.weight

    def hidden_states(self, tokens: torch.Tensor, positions: torch.Tensor | None = None, cache=None,
                      row_starts: torch.Tensor | None = None):
        """tokens (B, L) -> final-normed hidden states (B, L, h).

        With a megatron.model.kv_cache.KVCache, `tokens` are the NEW tokens only: they take
        positions cache.length + arange(L) and attend to every cached key (single rank only).

        Padded batches: `row_starts` (B,) is where each row's real tokens begin (left padding:
        the tokens before it are padding, hidden from every real token; megatron/attention/
        mask.py). Right padding needs nothing (causal attention never looks ahead): score each
        row's real tokens and ignore the rest. Every scheme sees each row at its own positions
        (position - row start): a padded row's real tokens get the outputs they get alone. With a
        cache, pass row_starts with the first (prompt) call; the cache keeps them."""
        B, L = tokens.shape
        k_pos = None
        if cache is not None:
            row_starts = cache.keep_row_starts(row_starts)
            positions, k_pos = cache.step_positions(L, tokens.device)
        elif positions is None:
            positions = torch.arange(L, device=tokens.device)
        if row_starts is not None:
            check_row_starts(row_starts, B)
            row_starts = row_starts.to(device=tokens.device, dtype=torch.int64)
            if not bool(row_starts.any()):
                row_starts = None  # nothing padded on the left: the unpadded path, bit for bit
        x = self.word_embeddings(tokens)
        absolute = self.position.embed(row_positions(positions, row_starts))
        if absolute is not None:
            x = x + absolute.to(x.dtype)
        x = self.embedding_dropout(x)
        # Once per forward, outside the checkpointed layers: every layer shares the scheme's bias.
        ctx = AttentionContext.build(self.model_cfg, self.position, self._backends, x, self.training, positions, k_pos,
                                     row_starts)
        if cache is not None:
            return self._cached_layers(x, ctx, cache)
        extra = {}
        if self.parallel is not None and self.parallel.is_tensor_parallel:
            ctx.dropout_rng = self.parallel.rng.fork
            extra["context_fn"] = self.parallel.rng.checkpoint_context_fn  # replay TP dropout
        for layer in self.layers:
            if self.checkpoint_activations and self.training and torch.is_grad_enabled():
                x = checkpoint(layer, x, ctx, use_reentrant=False, **extra)
            else:
                x = layer(x, ctx)
        return self.final_norm(x)

    def _cached_layers(self, x, ctx: AttentionContext, cache):
        if self.parallel is not None and self.parallel.is_tensor_parallel:
            raise ValueError("kv-cache decoding needs a single-rank model; merge the tensor-parallel "
                             "checkpoint first (tools/merge_tp_checkpoint.py)")
        for i, layer in enumerate(self.layers):
            x = layer(x, dataclasses.replace(ctx, cache=cache.layer(i)))
        cache.advance(ctx.k_pos)
        return self.final_norm(x)

    def new_cache(self):
        """An empty kv cache for this model (honours attention-window: memory stays O(W))."""
        from megatron.model.kv_cache import KVCache

        return KVCache(len(self.layers), self.model_cfg.attention_window)

    # ---- entry points ------------------------------------------------------------------------
    def forward(self, tokens, labels=None, loss_mask=None, positions=None, cache=None, row_starts=None):
        """Logits (B, L, V) (gathered over TP ranks); or, when labels are given, the NeoX loss:
        sum(CE(logits.float()) * loss_mask) / sum(loss_mask). `cache`, `row_starts`: see hidden_states."""
        x = self.hidden_states(tokens, positions, cache, row_starts)
        if labels is None:
            return gather_logits(parallel_logits(x, self.output_weight(), self.parallel), self.parallel)
        return masked_mean(self._token_losses_from_hidden(x, labels), loss_mask)

    @torch.no_grad()
    def token_losses(self, tokens, labels, positions=None, chunk: int = 2048, cache=None, row_starts=None):
        """Per-token cross entropy (B, L) in float32, computing the logits `chunk` positions at a
        time so evaluation at long lengths never holds (L, vocab) logits at once. `cache`,
        `row_starts`: see hidden_states."""
        return self._token_losses_from_hidden(self.hidden_states(tokens, positions, cache, row_starts), labels, chunk)

    def _token_losses_from_hidden(self, x, labels, chunk: int | None = None):
        B, L, _ = x.shape
        step = chunk or L
        w = self.output_weight()
        out = []
        for s in range(0, L, step):
            logits = parallel_logits(x[:, s : s + step], w, self.parallel).float()  # (B, l, V/tp)
            ce = token_cross_entropy(logits.flatten(0, 1), labels[:, s : s + step].flatten(), self.parallel)
            out.append(ce.view(B, -1))
        return torch.cat(out, dim=1)


def mark_positional_parallel(scheme: nn.Module) -> None:
    """Mark the scheme's per-head parameters (by their tags) as split over TP ranks in
    megatron-core's attributes, which DeepSpeed's grad norm reads."""
    from megatron.parallel.layers import mark_tensor_parallel
    from megatron.parallel.shard_tags import shard_dim

    for p in scheme.parameters():
        if shard_dim(p) is not None:
            mark_tensor_parallel(p, shard_dim(p))


def share_replicated_grads(scheme: nn.Module, parallel) -> None:
    """A scheme whose replicated parameters feed only this rank's heads (FIRE's shared MLP layer)
    declares `replicated_grad_sync`; it gets copy_to_tp (identity forward, gradient all-reduced
    over the TP group backward), so each rank's gradient is the TP=1 one."""
    if "replicated_grad_sync" in scheme.__dict__:
        import functools

        from megatron.parallel.layers import copy_to_tp

        scheme.__dict__["replicated_grad_sync"] = functools.partial(copy_to_tp, group=parallel.tp_group)


def count_parameters(model: nn.Module) -> int:
    """Unique parameters (the shared positional scheme counted once); works on the meta device."""
    return sum(p.numel() for p in model.parameters())
