"""Transformers' stock classes and this stack's model, both ways: which of our models a stock class
expresses, its config.json, and the tensor names and layouts between the two.

RoPE scaling (rotary-scaling linear, dynamic, yarn, llama3) travels as transformers' rope type of
that name (hf_rope_scaling.py), in both directions; a model it cannot express has no stock class.

    GPTNeoXForCausalLM   our classic block: layernorm (with bias), per-head [q|k|v] QKV, rotary on
                         rotary-pct of each head, exact or tanh GELU MLP of width intermediate-size
                         (with bias), sequential or parallel residual (two norms), MHA
    LlamaForCausalLM     RMSNorm, SwiGLU (our first projection [up | gate] <-> gate_proj, up_proj),
                         rotary on every channel, any key/value heads ([Q|K|V] or per head <-> q/k/v)
    MistralForCausalLM   Llama's block with attention-window W = sliding_window (keys i-W < j <= i),
                         no biases

tools/import_hf.py reads them (megatron/interop/hf_import.py); tools/export_hf.py writes them
(megatron/interop/hf_export.py) whenever `stock_class` finds one, else the remote-code model."""
from __future__ import annotations

import torch

from megatron.errors import UserError
from megatron.interop.hf_rope_scaling import export_rope


def from_hf(arch: str, weights: dict, model_cfg) -> dict:
    """HF tensors of class `arch` -> our GPTModel's names and layouts (model_cfg: the model)."""
    take = _Taker(weights)
    L, out = model_cfg.num_layers, {}
    if arch == "GPTNeoXForCausalLM":
        out["word_embeddings.weight"] = take("gpt_neox.embed_in.weight")
        for i in range(L):
            src = f"gpt_neox.layers.{i}."
            for ours, theirs in (("input_layernorm", "input_layernorm"), ("post_attention_layernorm",
                                 "post_attention_layernorm"), ("attention.query_key_value", "attention.query_key_value"),
                                 ("attention.dense", "attention.dense"), ("mlp.dense_h_to_4h", "mlp.dense_h_to_4h"),
                                 ("mlp.dense_4h_to_h", "mlp.dense_4h_to_h")):
                for part in ("weight", "bias"):
                    if src + f"{theirs}.{part}" in weights:
                        out[f"layers.{i}.{ours}.{part}"] = take(src + f"{theirs}.{part}")
        out["final_norm.weight"] = take("gpt_neox.final_layer_norm.weight")
        out["final_norm.bias"] = take("gpt_neox.final_layer_norm.bias")
        head = "embed_out.weight"
    else:
        out["word_embeddings.weight"] = take("model.embed_tokens.weight")
        for i in range(L):
            src = f"model.layers.{i}."
            out[f"layers.{i}.input_layernorm.weight"] = take(src + "input_layernorm.weight")
            out[f"layers.{i}.post_attention_layernorm.weight"] = take(src + "post_attention_layernorm.weight")
            for part in ("weight", "bias"):
                qkv = [src + f"self_attn.{p}_proj.{part}" for p in "qkv"]
                if all(n in weights for n in qkv):
                    out[f"layers.{i}.attention.query_key_value.{part}"] = _qkv(*map(take, qkv), model_cfg)
                if src + f"self_attn.o_proj.{part}" in weights:
                    out[f"layers.{i}.attention.dense.{part}"] = take(src + f"self_attn.o_proj.{part}")
                up, gate = src + f"mlp.up_proj.{part}", src + f"mlp.gate_proj.{part}"
                if up in weights:
                    out[f"layers.{i}.mlp.dense_h_to_4h.{part}"] = torch.cat([take(up), take(gate)])  # [x | gate]
                if src + f"mlp.down_proj.{part}" in weights:
                    out[f"layers.{i}.mlp.dense_4h_to_h.{part}"] = take(src + f"mlp.down_proj.{part}")
        out["final_norm.weight"] = take("model.norm.weight")
        head = "lm_head.weight"
    if model_cfg.no_weight_tying:
        out["output_layer.weight"] = take(head)
    elif head in weights:
        take(head)  # a tied model may still save the (same) matrix
    left = [k for k in weights if k not in take.used and not k.endswith("rotary_emb.inv_freq")]
    if left:
        raise UserError(f"the weights hold tensors this architecture does not use: {left[:6]}"
                        f"{' ...' if len(left) > 6 else ''}; is config.json the one these weights were saved with?")
    return out


def _qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m) -> torch.Tensor:
    """Llama's q/k/v projections as our QKV: [Q | K | V] with fewer kv heads (NeoX's GQA layout),
    per head [q_h | k_h | v_h] for multi-head attention (NeoX's layout, which HF's GPTNeoX shares)."""
    if m.grouped_query:
        return torch.cat([q, k, v])
    H = m.num_attention_heads
    return torch.cat([t.unflatten(0, (H, -1)) for t in (q, k, v)], dim=1).flatten(0, 1)


class _Taker:
    """Reads tensors by name, remembering which were used (the rest is an error: another model)."""

    def __init__(self, weights: dict):
        self.weights, self.used = weights, set()

    def __call__(self, name: str) -> torch.Tensor:
        if name not in self.weights:
            raise UserError(f"the weights have no tensor {name!r}, which this architecture needs; is config.json "
                            "the one these weights were saved with?")
        self.used.add(name)
        return self.weights[name]




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


def to_hf(arch: str, state: dict, m) -> dict:
    """Our GPTModel state -> the stock class's tensor names and layouts (inverse of from_hf)."""
    out = {}
    if arch == "GPTNeoXForCausalLM":
        out["gpt_neox.embed_in.weight"] = state["word_embeddings.weight"]
        for k, v in state.items():
            if k.startswith("layers."):
                i, rest = k.split(".", 2)[1:]
                out[f"gpt_neox.layers.{i}.{rest}"] = v
        out["gpt_neox.final_layer_norm.weight"] = state["final_norm.weight"]
        out["gpt_neox.final_layer_norm.bias"] = state["final_norm.bias"]
        head = "embed_out.weight"
    else:
        out["model.embed_tokens.weight"] = state["word_embeddings.weight"]
        for i in range(m.num_layers):
            src, dst = f"layers.{i}.", f"model.layers.{i}."
            out[dst + "input_layernorm.weight"] = state[src + "input_layernorm.weight"]
            out[dst + "post_attention_layernorm.weight"] = state[src + "post_attention_layernorm.weight"]
            for part in ("weight", "bias"):
                if src + f"attention.query_key_value.{part}" in state:
                    q, k, v = _split_qkv(state[src + f"attention.query_key_value.{part}"], m)
                    out.update({dst + f"self_attn.q_proj.{part}": q, dst + f"self_attn.k_proj.{part}": k,
                                dst + f"self_attn.v_proj.{part}": v})
                if src + f"attention.dense.{part}" in state:
                    out[dst + f"self_attn.o_proj.{part}"] = state[src + f"attention.dense.{part}"]
                if src + f"mlp.dense_h_to_4h.{part}" in state:
                    up, gate = state[src + f"mlp.dense_h_to_4h.{part}"].chunk(2)
                    out[dst + f"mlp.up_proj.{part}"], out[dst + f"mlp.gate_proj.{part}"] = up, gate
                if src + f"mlp.dense_4h_to_h.{part}" in state:
                    out[dst + f"mlp.down_proj.{part}"] = state[src + f"mlp.dense_4h_to_h.{part}"]
        out["model.norm.weight"] = state["final_norm.weight"]
        head = "lm_head.weight"
    if m.no_weight_tying:
        out[head] = state["output_layer.weight"]
    return {k: v.contiguous() for k, v in out.items()}


def _split_qkv(t: torch.Tensor, m) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Our QKV rows -> (q, k, v) rows: inverse of _qkv."""
    D, H, G = m.head_dim, m.num_attention_heads, m.kv_heads
    if m.grouped_query:
        return tuple(t.split([H * D, G * D, G * D]))
    q, k, v = t.unflatten(0, (H, 3 * D)).chunk(3, dim=1)
    return q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1)
