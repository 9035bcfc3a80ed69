"""The GPT as a DeepSpeed PipelineModule, with GPT-NeoX's layer numbering (GPT2ModelPipe):

    0        EmbeddingPipe       word embeddings (+ absolute positions) + dropout -> layer_00
    1        _pre_transformer_block   (a function: no parameters, no file)
    2..L+1   TransformerLayerPipe     -> layer_02 .. layer_{L+1}
    L+2      _post_transformer_block  (a function)
    L+3      NormPipe            `norm.*`                     -> layer_{L+3}
    L+4      OutputPipe          `final_linear.weight` (untied) -> layer_{L+4}

Built from the same blocks as GPTModel, with the same AttentionContext.build and loss
(masked_mean in megatron/model/gpt.py). Activations between stages are tensors only: hidden states
(B, L, h). The attention context (positions, the backend, its prepared state: the positions'
layout check, a host sync, and the scheme's clamped kernel) is built once per forward of a stage,
as GPTModel builds it once per forward, and its layers read it from the stage (StageContext);
building it in every layer cost a host sync and the clamps per layer and per recomputed layer.

The positional scheme is ONE instance per stage, shared by that stage's layers (and the
embedding, for absolute schemes). Each stage thus holds a replica: the replicas start equal (the
initial values come from one GPTModel built with the caller's seed), their gradients are summed
over the pipe group before the optimizer step (the sequential model's gradient is the sum over
layers too), and gradient clipping counts them once (`ds_pipe_replicated`).
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec
from torch import nn
from torch.utils.checkpoint import checkpoint

from megatron.model.attention import AttentionContext, cached_backend
from megatron.model.gpt import GPTModel, build_init, build_norm, masked_mean
from megatron.model.layer_numbering import sequential_key
from megatron.model.sharding import UNSHARDED
from megatron.model.transformer import TransformerLayer
from megatron.positional.base import positional_spec
from megatron.positional.distance import position_run
from megatron.positional.registry import build_scheme


class StageContext:
    """The AttentionContext of the forward a stage is running, for its layers to share: GPTPipe
    builds it when its forward starts, and re-enters it for each recomputation of a checkpointed
    range of layers (which runs in the backward, after that forward has returned)."""

    def __init__(self):
        self.current: AttentionContext | None = None

    @contextlib.contextmanager
    def use(self, ctx: AttentionContext | None):
        saved, self.current = self.current, ctx
        try:
            yield
        finally:
            self.current = saved


class EmbeddingPipe(nn.Module):
    """tokens (B, L) or (tokens,) -> hidden (B, L, h). Holds the stage's scheme for `embed`."""

    def __init__(self, model_cfg, vocab_size: int, init, scheme: nn.Module, stage: StageContext | None = None):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, model_cfg.hidden_size)
        init(self.word_embeddings.weight)
        self.position = scheme
        self.stage = stage
        self.embedding_dropout = nn.Dropout(model_cfg.hidden_dropout)

    def forward(self, inputs):
        tokens = inputs[0] if isinstance(inputs, (tuple, list)) else inputs
        x = self.word_embeddings(tokens)
        ctx = self.stage.current if self.stage is not None else None
        positions = ctx.q_pos if ctx is not None else position_run(0, tokens.shape[1], tokens.device)
        absolute = self.position.embed(positions)
        if absolute is not None:
            x = x + absolute.to(x.dtype)
        return self.embedding_dropout(x)


class TransformerLayerPipe(TransformerLayer):
    """TransformerLayer whose forward takes only the hidden states (pipeline activations); the
    attention context is its stage's (StageContext), built once per forward of the stage."""

    def __init__(self, model_cfg, init, out_init, scheme: nn.Module, stage: StageContext | None = None):
        super().__init__(model_cfg, init, out_init)
        self.model_cfg = model_cfg
        self.position = scheme  # the stage's shared instance (also a stage attribute)
        self.stage = stage
        self._backends: dict = {}  # for a call outside a stage's forward only

    def forward(self, x):  # (B, L, h)
        ctx = self.stage.current if self.stage is not None else None
        if ctx is None:  # called on its own, outside GPTPipe's forward: a context for this call
            positions = position_run(0, x.shape[1], x.device)
            ctx = AttentionContext.build(self.model_cfg, self.position, self._backends, x.device, x.dtype,
                                         self.training, positions)
        return super().forward(x, ctx)


class NormPipe(nn.Module):
    def __init__(self, model_cfg):
        super().__init__()
        self.norm = build_norm(model_cfg, model_cfg.hidden_size)

    def forward(self, x):
        return self.norm(x)


class OutputPipe(nn.Module):
    """Untied output layer: hidden (B, L, h) -> logits (B, L, V)."""

    def __init__(self, model_cfg, vocab_size: int, init):
        super().__init__()
        self.final_linear = nn.Linear(model_cfg.hidden_size, vocab_size, bias=False)
        init(self.final_linear.weight)

    def forward(self, x):
        return self.final_linear(x)


def _pre_transformer_block(x):
    # NeoX transposes to [s, b, h] here; our layers take (B, L, h), so this only holds the index.
    return x


def _post_transformer_block(x):
    return x


def _tied_logits(embedding: EmbeddingPipe, x):
    return F.linear(x, embedding.word_embeddings.weight)


def loss_fn(logits: torch.Tensor, labels_and_mask) -> torch.Tensor:
    """NeoX's loss: sum(CE(float logits) * loss_mask) / sum(loss_mask), as GPTModel.forward."""
    labels, loss_mask = labels_and_mask
    return masked_mean(UNSHARDED.token_cross_entropy(logits.float().flatten(0, 1), labels.flatten()), loss_mask)


def layer_specs(model_cfg, vocab_size: int, scheme: nn.Module, stage: StageContext | None = None) -> list:
    """The NeoX-numbered spec list (see the module docstring); `stage`: the context the stage's
    embedding and layers read (GPTPipe's)."""
    L, h = model_cfg.num_layers, model_cfg.hidden_size
    init = build_init(model_cfg.init_method, model_cfg.init_method_std, L, h)
    out_init = build_init(model_cfg.output_layer_init_method, model_cfg.init_method_std, L, h)
    tied = not model_cfg.no_weight_tying
    if tied:  # as NeoX: the same key at both ends, DeepSpeed all-reduces the tied gradient
        embed = TiedLayerSpec("embed", EmbeddingPipe, model_cfg, vocab_size, init, scheme, stage=stage,
                              tied_weight_attr=["word_embeddings.weight"])
        output = TiedLayerSpec("embed", EmbeddingPipe, model_cfg, vocab_size, init, scheme, stage=stage,
                               forward_fn=_tied_logits, tied_weight_attr=["word_embeddings.weight"])
    else:
        embed = LayerSpec(EmbeddingPipe, model_cfg, vocab_size, init, scheme, stage=stage)
        output = LayerSpec(OutputPipe, model_cfg, vocab_size, init)
    layers = [LayerSpec(TransformerLayerPipe, model_cfg, init, out_init, scheme, stage=stage) for _ in range(L)]
    return [embed, _pre_transformer_block, *layers, _post_transformer_block, LayerSpec(NormPipe, model_cfg), output]


def check_pipeline_supported(model_cfg, num_stages: int, model_parallel_size: int) -> None:
    if model_parallel_size > 1 and num_stages > 1:
        raise ValueError(f"pipe-parallel-size {num_stages} with model-parallel-size {model_parallel_size} is "
                         "not supported yet: use pipeline or tensor parallelism, not both")
    if num_stages > model_cfg.num_layers:
        raise ValueError(f"pipe-parallel-size {num_stages} exceeds num-layers {model_cfg.num_layers}: every "
                         "stage needs at least one transformer layer")


class GPTPipe(PipelineModule):
    """GPTModel as pipeline stages. Build it right after seeding, as GPTModel: its initial values
    are GPTModel's for the same seed, on every stage and for any number of stages."""

    def __init__(self, model_cfg, vocab_size: int, topology, checkpoint_activations: bool = False,
                 checkpoint_num_layers: int = 1):
        check_pipeline_supported(model_cfg, topology.get_dim("pipe"), topology.get_dim("model"))
        # The reference draws from the caller's RNG exactly as the sequential path does; the
        # stage's own construction then runs on a forked RNG, so later draws (dropout) match too.
        reference = GPTModel(model_cfg, vocab_size).state_dict()
        stage = StageContext()
        with torch.random.fork_rng(devices=[]):
            scheme = build_scheme(model_cfg.pos_emb, positional_spec(model_cfg))
            super().__init__(
                layers=layer_specs(model_cfg, vocab_size, scheme, stage), topology=topology, loss_fn=loss_fn,
                partition_method="type:TransformerLayerPipe",  # NeoX: balance transformer layers
                activation_checkpoint_interval=checkpoint_num_layers if checkpoint_activations else 0,
                activation_checkpoint_func=self._checkpoint,
                checkpointable_layers=["TransformerLayerPipe"],
            )
        self.model_cfg = model_cfg
        self.position = scheme
        self.stage = stage
        self._backends: dict = {}
        self._has_layers = any(isinstance(f, TransformerLayerPipe) for f in self.forward_funcs)
        self._load_sequential(reference)
        self._mark_replicated_scheme()

    # ---- the attention context, once per forward -----------------------------------------------
    def forward(self, forward_input):
        with self.stage.use(self._context(forward_input)):
            return super().forward(forward_input)

    def _context(self, forward_input) -> AttentionContext | None:
        """The context this stage's layers share in one forward (None without layers). Its input
        is the token ids (B, L) on the first stage, else the hidden states (B, L, h); the layers'
        hidden states have the dtype of the input, or on the first stage of the embedding."""
        if not self._has_layers:
            return None
        first = forward_input[0] if isinstance(forward_input, (tuple, list)) else forward_input
        dtype = first.dtype if first.is_floating_point() else self._embedding().word_embeddings.weight.dtype
        positions = position_run(0, first.shape[1], first.device)
        return AttentionContext.build(self.model_cfg, self.position, self._backends, first.device, dtype,
                                      self.training, positions)

    def _embedding(self) -> EmbeddingPipe:
        return next(m for _, m in self.local_modules() if isinstance(m, EmbeddingPipe))

    def _checkpoint(self, function, *args):
        """Activation checkpointing of a range of layers (non-reentrant, as GPTModel) that
        recomputes them in this forward's context, which the backward no longer holds (and with
        several micro-batches in flight, a later forward's is current by then)."""
        ctx = self.stage.current

        def run(*inputs):
            with self.stage.use(ctx):
                return function(*inputs)

        return checkpoint(run, *args, use_reentrant=False)

    def position_stats(self) -> dict[str, float]:
        """The shared scheme's logged statistics (every stage holds the same full-head copy)."""
        return self.position.stats()

    def full_position(self):
        """The shared scheme, all heads (as GPTModel.full_position)."""
        return self.position

    def backend(self, device: torch.device, dtype: torch.dtype):
        """The attention backend the layers resolve (for logging, as GPTModel.backend)."""
        return cached_backend(self._backends, self.model_cfg, self.position, device, dtype, self.training)

    # ---- initial values ----------------------------------------------------------------------
    def local_modules(self) -> list[tuple[int, nn.Module]]:
        """(NeoX layer index, module) for every module this stage holds (tied embedding = 0)."""
        out = [(int(name), m) for name, m in self.named_children() if name.isdigit()]
        if "embed" in self.tied_modules:
            out.append((0, self.tied_modules["embed"]))
        return sorted(out, key=lambda item: item[0])

    @torch.no_grad()
    def _load_sequential(self, state: dict) -> None:
        L, tied = self.model_cfg.num_layers, not self.model_cfg.no_weight_tying
        for idx, module in self.local_modules():
            for key, tensor in module.state_dict(keep_vars=True).items():
                tensor.data.copy_(state[sequential_key(idx, key, L, tied)])

    # ---- the replicated scheme -----------------------------------------------------------------
    def scheme_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.position.parameters() if p.requires_grad]

    def _mark_replicated_scheme(self) -> None:
        """Count the scheme (and tied copies) once in gradient norms. DeepSpeed's ZeRO/bf16 norms
        skip `ds_pipe_replicated` params; its fp32 clip_grad_norm_ instead counts only params
        marked `model_parallel` on stages > 0, so mark every non-replicated one there."""
        if self.num_stages == 1 or self.stage_id == 0:
            return
        for p in self.scheme_parameters():
            p.ds_pipe_replicated = True
        for p in self.parameters():
            if not getattr(p, "ds_pipe_replicated", False):
                p.model_parallel = True

    def get_tied_weights_and_groups(self):
        """DeepSpeed's pipe engine all-reduces (sums) these grads before the optimizer step."""
        pairs = super().get_tied_weights_and_groups()
        if self.num_stages > 1:
            group = self._grid.get_pipe_parallel_group()
            for p in self.scheme_parameters():
                if p.grad is None:  # every stage must join the collective
                    p.grad = torch.zeros_like(p)
                pairs.append((p, group))
        return pairs

    def allreduce_tied_weight_gradients(self):
        # DeepSpeed 0.19.8's engine calls get_tied_weights_and_groups; older engines (and NeoX's
        # DeeperSpeed) call this one: both include the scheme.
        for weight, group in self.get_tied_weights_and_groups():
            torch.distributed.all_reduce(weight.grad, group=group)
