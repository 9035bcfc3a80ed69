"""The parameter count of a model config, computed without building the model.

Building GPTModel (even on the meta device) costs time per layer: 2,000 layers took 6.8 s and
100,000 layers no answer in 120 s. The count below is O(1) in the number of layers: the
transformer layers, embeddings and norms by arithmetic (the shapes megatron/model/ builds), the
shared positional scheme by building only that scheme, tiny (it has a handful of parameters per
head, or the learned position table), so every scheme is counted exactly.
tests/unit/test_config_refusals.py checks it against count_parameters(GPTModel) on the meta
device for every scheme, norm, bias and tying choice.
"""
from __future__ import annotations

import dataclasses

# Above this many parameters no machine (or cluster) holds the model's training state: 1e13
# parameters are 160 TB of fp32 weights, gradients and Adam moments (16 bytes each). The largest
# models trained so far are ~2e12 parameters.
MAX_PARAMETERS = 10**13
TRAIN_BYTES_PER_PARAMETER = 16  # fp32 weight + gradient + Adam exp_avg + exp_avg_sq


def _norm(m, dim: int) -> int:
    if m.norm == "rmsnorm":
        return dim  # weight only
    return 2 * dim if m.use_bias_in_norms else dim


def layer_parameters(m) -> int:
    """One TransformerLayer: two norms (both kept with gpt-j-tied), QKV (fewer key/value rows with
    grouped-query attention) + dense, the MLP at NeoX's widths (megatron/model/transformer.py)."""
    h = m.hidden_size
    qkv = h + 2 * m.kv_heads * (h // m.num_attention_heads)
    attn = h * qkv + h * h + (qkv + h if m.use_bias_in_attn_linear else 0)
    width, inner = m.mlp_widths
    mlp = h * width + inner * h + (width + h if m.use_bias_in_mlp else 0)
    return 2 * _norm(m, h) + attn + mlp


def _scheme_parameters(m, positions: int) -> int:
    import torch

    from megatron.positional.base import positional_spec
    from megatron.positional.registry import build_scheme

    spec = dataclasses.replace(positional_spec(m), max_position_embeddings=positions)
    with torch.no_grad():
        return sum(p.numel() for p in build_scheme(m.pos_emb, spec).parameters())


def positional_parameters(m) -> int:
    """The shared positional scheme's parameters. Built on the CPU with a table of 1 and of 2
    positions (kilobytes; the meta device would cost seconds of torch imports at every config
    load): a scheme's count is linear in max-position-embeddings (only `learned` depends on it)."""
    one, two = _scheme_parameters(m, 1), _scheme_parameters(m, 2)
    return one + (m.max_position_embeddings - 1) * (two - one)


def parameter_terms(m, vocab_size: int, positional: bool = True) -> dict[str, int]:
    """{the key that sizes it: parameters} for the parts of the model (TP 1, whole model)."""
    h = m.hidden_size
    terms = {
        "num_layers": m.num_layers * layer_parameters(m) + _norm(m, h),  # + the final norm
        "padded_vocab_size": vocab_size * h * (1 if not m.no_weight_tying else 2),
    }
    if positional:
        terms["max_position_embeddings"] = positional_parameters(m)
    return terms


def parameter_count(m, vocab_size: int) -> int:
    """Exactly count_parameters(GPTModel(m, vocab_size)), in O(1) time."""
    return sum(parameter_terms(m, vocab_size).values())


def human_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB", "EB"):
        if n < 1000 or unit == "EB":
            return f"{n:.3g} {unit}" if unit != "B" else f"{n} B"
        n /= 1000
    raise AssertionError  # unreachable


def size_problem(m) -> tuple[str, str] | None:
    """(key to blame, message) when the model cannot fit any machine. The vocabulary counts only
    when padded-vocab-size is set (otherwise it is known only once the tokenizer is read)."""
    terms = parameter_terms(m, m.padded_vocab_size or 0, positional=False)
    if sum(terms.values()) <= MAX_PARAMETERS:  # else the width may be too big to build even a tiny scheme
        terms = parameter_terms(m, m.padded_vocab_size or 0)
    total = sum(terms.values())
    if total <= MAX_PARAMETERS:
        return None
    blame = max(terms, key=terms.get)
    return blame, (f"the model would have at least {total:,} parameters ({total:.3g}; "
                   f"{human_bytes(total * TRAIN_BYTES_PER_PARAMETER)} of weights, gradients and Adam "
                   f"state at {TRAIN_BYTES_PER_PARAMETER} bytes each), more than any machine can hold; "
                   f"the limit is {MAX_PARAMETERS:.0e} parameters: reduce num-layers, hidden-size, "
                   "intermediate-size or the vocabulary")
