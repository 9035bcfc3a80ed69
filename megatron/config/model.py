"""Model shape, positional scheme, attention, norms and initialisation (NeoX model keys)."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from megatron.config.attention_types import problems as attention_config_problems
from megatron.config.backend_names import backend_names
from megatron.config.fields import key
from megatron.config.scheme_options import scheme_names, scheme_options

POS_CLAMPS = ("straight-through", "projected")  # see pos_clamp; megatron/training/projection.py
# NeoX's init_functions.py, every name it accepts (megatron/model/init.py)
INIT_METHODS = ("normal", "scaled_normal", "orthogonal", "scaled_orthogonal", "small_init", "wang_init",
                "xavier_normal", "xavier_uniform", "single_residual_scaled_normal")
_FUSION_DOC = "Accepted for NeoX compatibility; changes nothing here (PyTorch's own kernels are used)."
PLAIN_ACTIVATIONS = ("gelu", "relu", "softsign", "swish", "mish", "silu")
GATED_ACTIVATIONS = ("geglu", "reglu", "swiglu", "bilinear", "glu")  # NeoX's get_activation: is_gated
ACTIVATIONS = PLAIN_ACTIVATIONS + GATED_ACTIVATIONS
OPTIONS_AFTER = "pos_clamp"  # the positional schemes' own keys follow this one (with_scheme_options)


def scheme_choices() -> tuple[str, ...]:
    """The names the scheme files register, and nothing else: a scheme is known by its file
    registering it, not by a second list here (read without importing torch: a refused value is
    answered before torch loads)."""
    return tuple(scheme_names())


def with_scheme_options(cls):
    """Adds every positional scheme's own options (declared in its file: megatron/positional/
    options.py; read without importing it: megatron/config/scheme_options.py) to the model config
    as keys, right after pos-emb's: typed, bounded and documented like any key, one declaration
    each. Applied before @dataclass, which then reads them as fields in the annotations' order."""
    annotations = cls.__dict__["__annotations__"]  # the class body declares keys, so it has them
    ordered = {}
    for name, annotation in annotations.items():
        ordered[name] = annotation
        if name != OPTIONS_AFTER:
            continue
        for option, (opt, schemes) in scheme_options().items():
            assert option not in annotations, f"positional option {option!r} is also a model key"
            ordered[option] = opt.type
            setattr(cls, option, key(opt.default, opt.doc, choices=opt.choices, ge=opt.ge, gt=opt.gt, le=opt.le,
                                     lt=opt.lt, read_by=tuple(schemes), default_from=opt.default_from))
    annotations.clear()
    annotations.update(ordered)
    return cls


def backend_choices() -> tuple[str, ...]:
    """"auto" and the attention registry's names, in its preference order (read from the backend
    files without importing them: megatron/config/backend_names.py)."""
    return ("auto", *backend_names())


@dataclass(frozen=True)
@with_scheme_options
class ModelConfig:
    num_layers: int = key(required=True, doc="Number of transformer layers.", ge=1)
    hidden_size: int = key(required=True, doc="Transformer hidden size.", ge=1)
    num_attention_heads: int = key(required=True, doc="Number of attention heads.", ge=1)
    seq_length: int = key(required=True, doc="Training sequence length (tokens per sample).", ge=1)
    max_position_embeddings: int | None = key(
        None, "Size of the learned position table; defaults to seq-length. Must be >= seq-length "
        "when pos-emb is learned.", ge=1)
    pos_emb: str = key(
        "learned", "Positional scheme, one of the positional registry's names (kerple_log, "
        "kerple_power_* and the NeoX ones).", choices=scheme_choices)
    pos_clamp: str = key(
        "straight-through", "How a positional parameter's domain (KERPLE's p, a >= 0.01, ...) is "
        "kept. straight-through: the forward uses the clamped value, the gradient passes as if "
        "unclamped and the stored value may leave the domain (what the paper's code amounted to "
        "under bf16, where its in-place clamp never reached DeepSpeed's fp32 master weights); "
        "projected: also clamp the stored value, fp32 master copy included, after every optimizer "
        "step (the paper's code in fp32). The stored values are logged as <param>_raw_*.",
        choices=POS_CLAMPS)
    attention_window: int | None = key(
        None, "Our extension: sliding window of W keys, query i attends keys j with i-W < j <= i. "
        "Valid with every positional scheme and backend; null = full causal attention.", ge=1)
    attention_logn_scaling: bool = key(
        False, "Entropy-invariant log-n scaling (Su; Qwen's logn-attn): query i's q.k/sqrt(d) is "
        "multiplied by max(1, log(n_i) / log(seq-length)), n_i the number of keys it sees "
        "(i + 1, at most attention-window). Composes with every pos-emb and backend, kv-cache and "
        "export included.")
    attention_logn_everywhere: bool = key(
        False, "With attention-logn-scaling: use log(n_i) / log(seq-length) for every query, below "
        "the training length too (Su's article), instead of only past it (Qwen's).")
    attention_config: list | None = key(
        None, "NeoX's per-layer attention types, [[[types...], count], ...] (count \"all\" repeats the "
        "pattern over every layer). global and flash are this stack's attention (flash-attn computes the "
        "same function; attention-backend picks the kernel); the other NeoX types (local, sparse_*, "
        "bigbird, bslongformer, gmlp, amlp, rwkv, mamba) are refused by name.")
    attention_backend: str = key(
        "auto", "Attention kernel, one of the attention registry's names or auto (the best that "
        "supports the scheme and device); checked against the scheme and device by the backend "
        "resolver, which names the valid pairs.", choices=backend_choices)
    attention_softmax_in_fp32: bool = key(False, "Compute the attention softmax in fp32.")
    norm: str = key("layernorm", "Normalisation layer.", choices=("layernorm", "rmsnorm"))
    layernorm_epsilon: float = key(1e-5, "LayerNorm epsilon.", gt=0)
    rms_norm_epsilon: float = key(1e-8, "RMSNorm epsilon.", gt=0)
    no_weight_tying: bool = key(False, "Untie the input embedding and the output layer.")
    activation: str = key(
        "gelu", "MLP activation, NeoX's set. gelu (exact erf; tanh with bias-gelu-fusion), relu, softsign, "
        "swish (x * sigmoid(x)), mish, silu; gated (the first projection's output is split into halves "
        "[x, gate] and the MLP computes act(gate) * x): geglu (gelu), reglu (relu), swiglu (swish, "
        "Llama), bilinear (identity), glu (sigmoid). Gated MLPs are sized by NeoX's rule "
        "(intermediate-size).", choices=ACTIVATIONS)
    intermediate_size: int | None = key(
        None, "MLP size before NeoX's sizing rule; defaults to expansion-factor * hidden-size, or 4 * "
        "hidden-size. A gated activation takes int(2/3 * it) for both halves together, each half "
        "being half of that; both are then rounded up, the whole to a multiple of 2 * mlp-multiple-of "
        "and a half to a multiple of mlp-multiple-of (Llama 7B: 32768 -> halves of 11008 with "
        "mlp-multiple-of 256). Non-gated: the width rounded up to a multiple of 2 * mlp-multiple-of.", ge=1)
    expansion_factor: float | None = key(
        None, "MLP size as a multiple of hidden-size (NeoX); folded into intermediate-size = "
        "int(expansion-factor * hidden-size). Set it or intermediate-size, not both.", gt=0)
    mlp_multiple_of: int = key(1, "Round the MLP widths up to multiples of this (NeoX's rule: see "
                               "intermediate-size).", ge=1)
    num_kv_heads: int | None = key(
        None, "Key/value heads: null or num-attention-heads = multi-head attention; fewer = grouped-query "
        "attention (1 = multi-query): query head i uses key/value head i // (heads / kv-heads). The "
        "QKV projection is then [all queries | all keys | all values] (NeoX's GQA layout) instead of "
        "per-head [q | k | v]. Must divide num-attention-heads.", ge=1)
    sliding_window_width: int | None = key(
        None, "NeoX's (Mistral's) sliding window: query i attends keys i - W ... i, W + 1 keys (flash-attn's "
        "window_size (W, -1), as NeoX passes it). Sets attention-window to W + 1; give one of the two.", ge=1)
    init_method: str = key("normal", "Init of most weights.", choices=INIT_METHODS)
    output_layer_init_method: str = key(
        "scaled_normal", "Init of the attention-dense and MLP output weights (scaled_normal = "
        "std / sqrt(2 * num-layers)).", choices=INIT_METHODS)
    init_method_std: float = key(0.02, "Standard deviation of the normal inits.", gt=0)
    hidden_dropout: float = key(0.0, "Dropout after attention and MLP.", ge=0, lt=1)
    attention_dropout: float = key(0.0, "Dropout on attention probabilities.", ge=0, lt=1)
    apply_query_key_layer_scaling: bool = key(
        False, "Megatron's Q.K scaling by layer number, an fp16 overflow guard with a numerically "
        "equivalent result; scores are computed without it here.", inert=True)
    use_bias_in_norms: bool = key(True, "Bias in the norm layers.")
    use_bias_in_attn_linear: bool = key(True, "Bias in the attention QKV and output projections.")
    use_bias_in_mlp: bool = key(True, "Bias in the MLP projections.")
    make_vocab_size_divisible_by: int = key(
        128, "Pad the vocabulary to a multiple of this times model-parallel-size.", ge=1)
    padded_vocab_size: int | None = key(
        None, "Padded vocabulary size; null = derived at run time from the tokenizer.", ge=1)
    gpt_j_residual: bool = key(
        False, "GPT-J parallel residual (Pythia, GPT-NeoX-20B): x + drop(attn(ln1(x))) + drop(mlp(ln2(x))) "
        "instead of two sequential residual steps.")
    gpt_j_tied: bool = key(
        False, "With gpt-j-residual: one norm for both branches, x + attn(ln1(x)) + mlp(ln1(x)) "
        "(post-attention-layernorm is kept, unused, as NeoX keeps it).")
    onnx_safe: bool = key(
        False, "NeoX's ONNX-export workaround: with activation gelu, GELU as x * 0.5 * (erf(x / 1.41421) + 1) "
        "(NeoX's erf_gelu, its constant included). Cannot be combined with bias-gelu-fusion.")
    output_layer_parallelism: str = key(
        "column", "How the output layer is split under tensor parallelism; only column (by vocabulary, "
        "NeoX's default) is implemented.", choices=("column",), inert=True)
    scaled_upper_triang_masked_softmax_fusion: bool = key(False, _FUSION_DOC, inert=True)
    scaled_masked_softmax_fusion: bool = key(False, _FUSION_DOC, inert=True)
    bias_gelu_fusion: bool = key(
        False, "With activation gelu: NeoX's fused bias+GELU kernel, which computes the tanh approximation "
        "0.5 x (1 + tanh(0.79788456 x (1 + 0.044715 x^2))); honoured here as that GELU (Pythia and "
        "GPT-NeoX-20B set it). Other activations: no effect, as in NeoX.")
    use_flashattn_swiglu: bool = key(
        False, "NeoX: flash-attn's fused SwiGLU kernel, the same function as activation swiglu; PyTorch's "
        "ops compute it here.", inert=True)
    bias_dropout_fusion: bool = key(False, _FUSION_DOC, inert=True)
    rope_fusion: bool = key(False, _FUSION_DOC, inert=True)
    layernorm_fusion: bool = key(False, _FUSION_DOC, inert=True)

    def __post_init__(self):
        # Derived defaults are filled in here so the resolved config states them explicitly.
        if self.max_position_embeddings is None and isinstance(self.seq_length, int):
            object.__setattr__(self, "max_position_embeddings", self.seq_length)
        for f in fields(self):  # scheme options whose None means another key's value
            source = f.metadata.get("default_from")
            if source and getattr(self, f.name) is None and isinstance(getattr(self, source), int):
                object.__setattr__(self, f.name, getattr(self, source))
        if self.intermediate_size is None and isinstance(self.hidden_size, int):
            if isinstance(self.expansion_factor, (int, float)):  # folded, so a resolved config reloads
                object.__setattr__(self, "intermediate_size", int(self.expansion_factor * self.hidden_size))
                object.__setattr__(self, "expansion_factor", None)
            elif self.expansion_factor is None:
                object.__setattr__(self, "intermediate_size", 4 * self.hidden_size)
        if (self.sliding_window_width is not None and self.attention_window is None
                and isinstance(self.sliding_window_width, int)):
            object.__setattr__(self, "attention_window", self.sliding_window_width + 1)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def gated_mlp(self) -> bool:
        return self.activation in GATED_ACTIVATIONS

    @property
    def kv_heads(self) -> int:
        """Key/value heads (num-kv-heads, or every head)."""
        return self.num_kv_heads or self.num_attention_heads

    @property
    def grouped_query(self) -> bool:
        """NeoX's `gqa`: fewer key/value heads than query heads (then the QKV layout is [Q | K | V])."""
        return self.kv_heads != self.num_attention_heads

    @property
    def mlp_widths(self) -> tuple[int, int]:
        """(first projection's outputs, second projection's inputs): NeoX's ParallelMLP sizing rule
        (NeoX's megatron/model/transformer.py at its main). Equal for a non-gated MLP whose width is a
        multiple of 2 * mlp-multiple-of; a gated MLP's first output is twice the second's input.
        check() refuses a config where they do not fit (NeoX would build mismatched layers)."""
        width = self.intermediate_size or 4 * self.hidden_size
        half = width
        if self.gated_mlp:
            width = int(width * 2 / 3)
            half = width // 2
        m = self.mlp_multiple_of
        return 2 * m * -(-width // (2 * m)), m * -(-half // m)

    def check(self) -> list[tuple[str, str]]:
        """Cross-field rules as (key, what is wrong) pairs; the loader adds value and file."""
        out = []
        if self.hidden_size % self.num_attention_heads:
            out.append(("hidden_size", f"must be divisible by num-attention-heads "
                        f"({self.num_attention_heads})"))
        if self.pos_emb == "learned" and self.max_position_embeddings < self.seq_length:
            out.append(("max_position_embeddings", f"must be >= seq-length ({self.seq_length}) "
                        "when pos-emb is learned"))
        if self.attention_logn_scaling and isinstance(self.seq_length, int) and self.seq_length < 2:
            out.append(("attention_logn_scaling", "needs seq-length >= 2 (it divides by log(seq-length))"))
        if self.attention_logn_everywhere and not self.attention_logn_scaling:
            out.append(("attention_logn_everywhere", "only applies with attention-logn-scaling: true; "
                        "set that too, or remove this key"))
        # the schemes' rules between their options; lazy: the schemes import torch, importing the config must not
        from megatron.positional import registry
        from megatron.positional.base import config_options

        out += registry.option_problems(config_options(self))
        out += self._architecture_problems()
        return out

    def _fitting_mlp_sizes(self) -> str:
        """The fix for an intermediate-size whose MLP widths do not fit: for a gated MLP, 3 x the value
        when that fits (NeoX's rule keeps 2/3 of it, split in halves: Mistral 7B's halves of 14336
        need 43008), and the nearest values that fit."""
        def fits(size: int) -> bool:
            width, half = replace(self, intermediate_size=size).mlp_widths
            return width == (2 * half if self.gated_mlp else half)

        size, ideas = self.intermediate_size, []
        if self.gated_mlp and fits(3 * size):
            ideas.append(f"{3 * size} for halves of {size} (NeoX's rule keeps 2/3 of intermediate-size, split in two)")
        below = next((s for s in range(size - 1, 0, -1) if fits(s)), None)
        above = next(s for s in range(size + 1, 4 * size + 8) if fits(s))
        ideas.append(f"the nearest that fit, {', '.join(str(s) for s in (below, above) if s)}")
        return f"Set intermediate-size to {' or '.join(ideas)}, or change mlp-multiple-of"

    def _architecture_problems(self) -> list[tuple[str, str]]:
        """The block's options that NeoX itself refuses or would build inconsistently."""
        out = []
        if self.attention_config is not None and isinstance(self.num_layers, int):
            out += [("attention_config", p) for p in attention_config_problems(self.attention_config, self.num_layers)]
        if self.intermediate_size is not None and self.expansion_factor is not None:
            out.append(("expansion_factor", f"set together with intermediate-size ({self.intermediate_size}); "
                        "NeoX takes one of them: remove one"))
        if self.num_kv_heads is not None and self.num_attention_heads % self.num_kv_heads:
            out.append(("num_kv_heads", f"must divide num-attention-heads ({self.num_attention_heads})"))
        if self.onnx_safe and self.bias_gelu_fusion and self.activation == "gelu":
            out.append(("onnx_safe", "cannot be combined with bias-gelu-fusion (NeoX refuses it too): set one"))
        if self.gpt_j_tied and not self.gpt_j_residual:
            out.append(("gpt_j_tied", "only applies with gpt-j-residual: true; set that too, or remove this key"))
        if self.sliding_window_width is not None and self.attention_window != self.sliding_window_width + 1:
            out.append(("sliding_window_width", f"means attention-window {self.sliding_window_width + 1} (W + 1 "
                        f"keys), but attention-window is {self.attention_window}: give one of the two"))
        if not out and isinstance(self.intermediate_size, int):
            width, half = self.mlp_widths
            if width != (2 * half if self.gated_mlp else half):
                what = "twice its second projection's inputs" if self.gated_mlp else "its second projection's inputs"
                out.append(("intermediate_size", f"gives an MLP whose first projection's {width} outputs are not {what} "
                            f"({half}) after NeoX's rounding to mlp-multiple-of {self.mlp_multiple_of}: NeoX would "
                            f"build mismatched layers. {self._fitting_mlp_sizes()}"))
        return out
