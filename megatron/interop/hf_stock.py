"""Transformers' stock classes and this stack's model: which of our models a stock class expresses,
and its config.json (the tensors, both ways: megatron/interop/hf_adapters.py).

RoPE scaling (rotary-scaling linear, dynamic, yarn, llama3) travels as transformers' rope type of
that name (hf_rope_scaling.py), in both directions; a model it cannot express has no stock class.

    GPTNeoXForCausalLM   our classic block: layernorm (with bias), per-head [q|k|v] QKV, rotary on
                         rotary-pct of each head, exact or tanh GELU MLP of width intermediate-size
                         (with bias), sequential or parallel residual (two norms), MHA
    LlamaForCausalLM     RMSNorm, SwiGLU (our first projection [up | gate] <-> gate_proj, up_proj),
                         rotary on every channel, any key/value heads ([Q|K|V] or per head <-> q/k/v)
    MistralForCausalLM   Llama's block with attention-window W = sliding_window (keys i-W < j <= i),
                         no biases

The tensors, both ways: megatron/interop/hf_adapters.py. tools/import_hf.py reads them
(megatron/interop/hf_import.py); tools/export_hf.py writes them
(megatron/interop/hf_export.py) whenever `stock_class` finds one, else the remote-code model."""
from __future__ import annotations

from megatron.interop.hf_rope_scaling import export_rope


def stock_class(m) -> tuple[str | None, str]:
    """(the stock transformers class expressing model config `m`, or None; why not, when None)."""
    if m.pos_emb != "rotary":
        return None, f"pos-emb {m.pos_emb} (stock classes have rotary only)"
    if m.attention_logn_scaling:
        return None, "attention-logn-scaling (an evaluation option stock classes lack)"
    rope, why = export_rope(m, _max_positions(m))
    if rope is None:
        return None, why
    width, inner = m.mlp_widths
    if m.norm == "layernorm":
        why = [w for w, bad in (
            ("gpt-j-tied", m.gpt_j_tied), ("grouped-query attention", m.grouped_query),
            (f"activation {m.activation}", m.activation != "gelu" or m.onnx_safe),
            ("no norm or MLP biases", not (m.use_bias_in_norms and m.use_bias_in_mlp)),
            ("MLP widths rounded by mlp-multiple-of", (width, inner) != (m.intermediate_size, m.intermediate_size)),
            ("attention-window", m.attention_window is not None)) if bad]
        return (None, "GPTNeoX lacks " + ", ".join(why)) if why else ("GPTNeoXForCausalLM", "")
    why = [w for w, bad in (("parallel residual", m.gpt_j_residual), (f"activation {m.activation}", m.activation != "swiglu"),
                            ("partial rotary", m.rotary_pct != 1.0)) if bad]
    if m.attention_window is not None:
        if m.use_bias_in_attn_linear or m.use_bias_in_mlp:
            why.append("biases with a sliding window")
        return (None, "Mistral lacks " + ", ".join(why)) if why else ("MistralForCausalLM", "")
    return (None, "Llama lacks " + ", ".join(why)) if why else ("LlamaForCausalLM", "")


def _max_positions(m) -> int:
    """config.json's max_position_embeddings for model config `m` (transformers' dynamic RoPE scales from it)."""
    return m.max_position_embeddings or m.seq_length


def stock_config(arch: str, m, vocab_size: int, dtype: str) -> dict:
    """config.json for stock class `arch` expressing model config `m`."""
    common = {"architectures": [arch], "vocab_size": vocab_size, "hidden_size": m.hidden_size,
              "num_hidden_layers": m.num_layers, "num_attention_heads": m.num_attention_heads,
              "max_position_embeddings": _max_positions(m),
              "tie_word_embeddings": not m.no_weight_tying, "dtype": dtype,
              "attention_dropout": 0.0, "use_cache": True}
    rope = {**export_rope(m, _max_positions(m))[0], "rope_theta": float(m.rotary_emb_base)}  # stock_class: not None
    if arch == "GPTNeoXForCausalLM":
        return {**common, "model_type": "gpt_neox", "intermediate_size": m.intermediate_size,
                "hidden_act": "gelu_new" if m.bias_gelu_fusion else "gelu", "layer_norm_eps": m.layernorm_epsilon,
                "use_parallel_residual": m.gpt_j_residual, "attention_bias": m.use_bias_in_attn_linear,
                "hidden_dropout": 0.0, "rope_parameters": {**rope, "partial_rotary_factor": m.rotary_pct}}
    out = {**common, "model_type": "mistral" if arch == "MistralForCausalLM" else "llama",
           "intermediate_size": m.mlp_widths[1], "hidden_act": "silu", "rms_norm_eps": m.rms_norm_epsilon,
           "num_key_value_heads": m.kv_heads, "head_dim": m.head_dim, "rope_parameters": rope}
    if arch == "MistralForCausalLM":
        return {**out, "sliding_window": m.attention_window}
    return {**out, "attention_bias": m.use_bias_in_attn_linear, "mlp_bias": m.use_bias_in_mlp}
