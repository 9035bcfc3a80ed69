"""The NeoX GPT: embedding (+ absolute positions) -> N pre-LN layers -> final norm -> output layer.

One positional scheme instance (`self.position`) is shared by every layer, as in the KERPLE
paper: its parameters exist once in the optimizer, and their gradient is the sum over layers.

The model is always built whole (one rank). Tensor parallelism is applied from outside:
megatron/parallel/plan.py shards a built model (heads, MLP features and the vocabulary split over
the TP ranks, the scheme keeping this rank's heads) and swaps `self.sharding`, the few operations
of the forward that differ on a shard (logits, loss, dropout stream; megatron/model/sharding.py).
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from megatron.attention.mask import check_doc_starts, check_positions, check_row_starts, row_positions
from megatron.model.attention import AttentionContext, cached_backend
from megatron.model.init import build_init
from megatron.model.kv_cache import KVCache
from megatron.model.sharding import UNSHARDED
from megatron.model.size import refuse_impossible_size
from megatron.model.transformer import TransformerLayer, build_norm
from megatron.positional.base import positional_spec
from megatron.positional.distance import position_run
from megatron.positional.registry import build_scheme


class GPTModel(nn.Module):
    def __init__(self, model_cfg, vocab_size: int, checkpoint_activations: bool = False, check_size: bool = True):
        super().__init__()
        if check_size:  # before anything is allocated; False only for parameter_terms' own one-layer build
            refuse_impossible_size(self.parameter_terms(model_cfg, vocab_size), model_cfg, vocab_size)
        self.model_cfg = model_cfg
        self.vocab_size = vocab_size
        self.checkpoint_activations = checkpoint_activations
        self.sharding = UNSHARDED  # megatron/parallel/plan.py's parallelize swaps it on a TP shard
        L, h = model_cfg.num_layers, model_cfg.hidden_size
        init = build_init(model_cfg.init_method, model_cfg.init_method_std, L, h)
        out_init = build_init(model_cfg.output_layer_init_method, model_cfg.init_method_std, L, h)

        self.word_embeddings = nn.Embedding(vocab_size, h)
        init(self.word_embeddings.weight)
        self.position = build_scheme(model_cfg.pos_emb, positional_spec(model_cfg))
        self.embedding_dropout = nn.Dropout(model_cfg.hidden_dropout)
        self.layers = nn.ModuleList(TransformerLayer(model_cfg, init, out_init) for _ in range(L))
        self.final_norm = build_norm(model_cfg, h)
        if model_cfg.no_weight_tying:
            self.output_layer = nn.Linear(h, vocab_size, bias=False)
            init(self.output_layer.weight)
        else:
            self.output_layer = None  # logits use word_embeddings.weight
        self._backends: dict = {}

    @classmethod
    def parameter_terms(cls, model_cfg, vocab_size: int) -> dict[str, int]:
        """{the key that sizes it: parameters} for this model's parts (TP 1, whole model): the
        layers with the final norm, the vocabulary's embedding and output rows, the positional
        scheme. Counted on the model itself, built on the meta device (shapes, no memory) with ONE
        layer: every layer is that layer (one class, one config), so N layers are N times it.
        Building all N, even on meta, costs time per layer (2,000 layers took 6.8 s, 100,000 no
        answer in 120 s); one costs milliseconds at any width."""
        # attention-config only picks each layer's kernel (global or flash: the same parameters),
        # and a pattern written for N layers does not describe one
        one_layer = dataclasses.replace(model_cfg, num_layers=1, attention_config=None)
        # An unknown vocabulary is counted as 0 rows (the dry run's "+ N per vocabulary entry"), but
        # built with one: initialising a zero-row embedding makes torch warn on every start. The
        # vocabulary's parameters are rows of equal size, so N rows are N times one.
        rows = max(vocab_size, 1)
        with torch.device("meta"):
            model = cls(one_layer, rows, check_size=False)
        layer, position = count_parameters(model.layers[0]), count_parameters(model.position)
        built = count_parameters(model.word_embeddings) + (
            count_parameters(model.output_layer) if model.output_layer is not None else 0)
        rest = count_parameters(model) - layer - position - built  # the final norm
        return {"num_layers": model_cfg.num_layers * layer + rest, "padded_vocab_size": built // rows * vocab_size,
                "max_position_embeddings": position}

    @classmethod
    def parameter_count(cls, model_cfg, vocab_size: int) -> int:
        """count_parameters(GPTModel(model_cfg, vocab_size)), in time independent of the depth."""
        return sum(cls.parameter_terms(model_cfg, vocab_size).values())

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
        return self.sharding.full_scheme(self.position)

    def output_weight(self) -> torch.Tensor:
        return self.word_embeddings.weight if self.output_layer is None else self.output_layer.weight

    def hidden_states(self, tokens: torch.Tensor, positions: torch.Tensor | None = None, cache=None,
                      row_starts: torch.Tensor | None = None, documents=None):
        """tokens (B, L) -> final-normed hidden states (B, L, h).

        With a megatron.model.kv_cache.KVCache, `tokens` are the NEW tokens only: they take
        positions cache.length + arange(L) and attend to every cached key (single rank only).

        Padded batches: `row_starts` (B,) is where each row's real tokens begin (left padding:
        the tokens before it are padding, hidden from every real token; megatron/attention/
        mask.py). Right padding needs nothing (causal attention never looks ahead): score each
        row's real tokens and ignore the rest. Every scheme sees each row at its own positions
        (position - row start): a padded row's real tokens get the outputs they get alone. With a
        cache, pass row_starts with the first (prompt) call; the cache keeps them.

        Packed documents (training: megatron/attention/documents.py): no token attends to another
        document, and with reset positions whatever reads absolute positions (embeddings, FIRE,
        log-n) takes each token's position within its document; `positions` stay the row's (L,)
        positions, from which a relative scheme's differences are the same within a document.

        `positions` (L,) are every row's; (B, L) give each row its own (training's drawn positions,
        megatron/data/position_recipes.py: the backends that take drawn positions read them per row)."""
        B, L = tokens.shape
        k_pos = None
        if documents is not None:
            if cache is not None or row_starts is not None:
                raise ValueError("packed documents are a training batch's: they take no kv-cache and no padded rows")
            check_doc_starts(documents.starts, B, L)
            documents = documents.to(tokens.device)
        if cache is not None:
            row_starts = cache.keep_row_starts(row_starts)
            positions, k_pos = cache.step_positions(L, tokens.device)
        elif positions is None:
            positions = position_run(0, L, tokens.device)
        else:
            check_positions(positions, B, L)
        if row_starts is not None:
            check_row_starts(row_starts, B)
            row_starts = row_starts.to(device=tokens.device, dtype=torch.int64)
            if not bool(row_starts.any()):
                row_starts = None  # nothing padded on the left: the unpadded path, bit for bit
        x = self.word_embeddings(tokens)
        own = documents.within_positions() if documents is not None else None  # (B, L) with reset positions
        absolute = self.position.embed(row_positions(positions, row_starts) if own is None else own)
        if absolute is not None:
            x = x + absolute.to(x.dtype)
        x = self.embedding_dropout(x)
        # Once per forward, outside the checkpointed layers: every layer shares the scheme's bias.
        ctx = AttentionContext.build(self.model_cfg, self.position, self._backends, x.device, x.dtype, self.training,
                                     positions, k_pos, row_starts, documents)
        if cache is not None:
            return self._cached_layers(x, ctx, cache)
        ctx.dropout_rng = self.sharding.dropout_rng
        extra = self.sharding.checkpoint_kwargs()
        for layer in self.layers:
            if self.checkpoint_activations and self.training and torch.is_grad_enabled():
                x = checkpoint(layer, x, ctx, use_reentrant=False, **extra)
            else:
                x = layer(x, ctx)
        return self.final_norm(x)

    def _cached_layers(self, x, ctx: AttentionContext, cache):
        if self.sharding.is_tensor_parallel:
            raise ValueError("kv-cache decoding needs a single-rank model; merge the tensor-parallel "
                             "checkpoint first (tools/merge_tp_checkpoint.py)")
        for i, layer in enumerate(self.layers):
            x = layer(x, dataclasses.replace(ctx, cache=cache.layer(i)))
        cache.advance(ctx.k_pos)
        return self.final_norm(x)

    def new_cache(self):
        """An empty kv cache for this model (honours attention-window: memory stays O(W))."""
        return KVCache(len(self.layers), self.model_cfg.attention_window)

    # ---- entry points ------------------------------------------------------------------------
    def forward(self, tokens, labels=None, loss_mask=None, positions=None, cache=None, row_starts=None,
                documents=None):
        """Logits (B, L, V) (gathered over TP ranks); or, when labels are given, the NeoX loss:
        sum(CE(logits.float()) * loss_mask) / sum(loss_mask). `cache`, `row_starts`, `documents`:
        see hidden_states."""
        x = self.hidden_states(tokens, positions, cache, row_starts, documents)
        if labels is None:
            return self.logits(x)
        return masked_mean(self._token_losses_from_hidden(x, labels), loss_mask)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Final hidden states (B, L, h) -> logits (B, L, V), every vocabulary entry on every rank."""
        return self.sharding.gather_logits(self.sharding.logits(x, self.output_weight()))

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
            logits = self.sharding.logits(x[:, s : s + step], w).float()  # (B, l, V/tp)
            ce = self.sharding.token_cross_entropy(logits.flatten(0, 1), labels[:, s : s + step].flatten())
            out.append(ce.view(B, -1))
        return torch.cat(out, dim=1)


def masked_mean(losses: torch.Tensor, loss_mask: torch.Tensor | None = None) -> torch.Tensor:
    """NeoX's language-model loss, one definition for GPTModel and the pipeline model:
    sum(losses * loss_mask) / sum(loss_mask), the mask cast to the losses' dtype and shape
    (per-token float32 CE from the float logits); the plain mean without a mask."""
    if loss_mask is None:
        return losses.mean()
    mask = loss_mask.to(losses.dtype).reshape(losses.shape)
    return (losses * mask).sum() / mask.sum().clamp_min(1.0)


def count_parameters(model: nn.Module) -> int:
    """Unique parameters (the shared positional scheme counted once); works on the meta device."""
    return sum(p.numel() for p in model.parameters())
