"""GPTNeoXForCausalLM (Pythia, GPT-NeoX-20B): our classic block. Layernorm with bias, per-head
[q|k|v] QKV with biases, rotary on partial_rotary_factor of each head (transformers 4's rotary_pct),
exact or tanh GELU MLP of width intermediate_size (with bias), sequential or parallel residual
(use_parallel_residual <-> gpt-j-residual), multi-head attention. Our tensor names are NeoX's own
module names, which HF kept, under `gpt_neox.`."""
from __future__ import annotations

import re

from megatron.interop.state_dict_adapter import PARTS, Rule, StateDictAdapter

from .base import HFFamily
from .registry import register_family

GELU_EXACT = ("gelu", "gelu_python")  # transformers' ACT2CLS names of erf-GELU
GELU_TANH = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu_python_tanh")  # ... and of its tanh form


class GPTNeoXAdapter(StateDictAdapter):
    head = "embed_out.weight"
    MODULES = ("input_layernorm", "post_attention_layernorm", "attention.query_key_value", "attention.dense",
               "mlp.dense_h_to_4h", "mlp.dense_4h_to_h")

    def rules(self) -> list[Rule]:
        out = [Rule("word_embeddings.weight", ("gpt_neox.embed_in.weight",))]
        for i in range(self.m.num_layers):
            out += [Rule(f"layers.{i}.{mod}.{part}", (f"gpt_neox.layers.{i}.{mod}.{part}",), optional=True)
                    for mod in self.MODULES for part in PARTS]
        out += [Rule(f"final_norm.{part}", (f"gpt_neox.final_layer_norm.{part}",)) for part in PARTS]
        return out


@register_family
class GPTNeoX(HFFamily):
    arch, name, config_class, model_type = "GPTNeoXForCausalLM", "GPTNeoX", "GPTNeoXConfig", "gpt_neox"
    adapter_class = GPTNeoXAdapter
    # and the old causal-mask buffers (its _keys_to_ignore_on_load_unexpected)
    ignored = re.compile(r".*(\.rotary_emb\.inv_freq|\.attention\.bias|\.attention\.masked_bias)")
    layers_prefix = "gpt_neox.layers."
    defaults = {"vocab_size": 50432, "hidden_size": 6144, "num_hidden_layers": 44,
                "num_attention_heads": 64, "intermediate_size": 24576, "hidden_act": "gelu",
                "max_position_embeddings": 2048, "layer_norm_eps": 1e-5, "tie_word_embeddings": False,
                "use_parallel_residual": True, "attention_bias": True, "rope_theta": 10000.0,
                "partial_rotary_factor": 0.25}
    rope_spellings = {"rope_theta": "rotary_emb_base", "partial_rotary_factor": "rotary_pct"}

    def claims(self, m) -> bool:
        return m.norm == "layernorm"

    def lacks(self, m) -> list[str]:
        width, inner = m.mlp_widths
        return [w for w, bad in (
            ("gpt-j-tied", m.gpt_j_tied), ("grouped-query attention", m.grouped_query),
            (f"activation {m.activation}", m.activation != "gelu" or m.onnx_safe),
            ("no norm or MLP biases", not (m.use_bias_in_norms and m.use_bias_in_mlp)),
            ("MLP widths rounded by mlp-multiple-of", (width, inner) != (m.intermediate_size, m.intermediate_size)),
            ("attention-window", m.attention_window is not None)) if bad]

    def stock_config(self, m, common: dict, rope: dict) -> dict:
        return {**common, "model_type": self.model_type, "intermediate_size": m.intermediate_size,
                "hidden_act": "gelu_new" if m.bias_gelu_fusion else "gelu", "layer_norm_eps": m.layernorm_epsilon,
                "use_parallel_residual": m.gpt_j_residual, "attention_bias": m.use_bias_in_attn_linear,
                "hidden_dropout": 0.0, "rope_parameters": {**rope, "partial_rotary_factor": m.rotary_pct}}

    def neox_keys(self, r, heads: int) -> tuple[dict, dict]:
        act = r.get("hidden_act", "str")
        if act not in GELU_EXACT + GELU_TANH:
            raise r.refuse("hidden_act", f"{act!r} is not imported for GPTNeoX (one of {', '.join(GELU_EXACT + GELU_TANH)})")
        out = {"norm": "layernorm", "layernorm-epsilon": r.get("layer_norm_eps", "float"),
               "gpt-j-residual": r.get("use_parallel_residual", "bool"),
               "use-bias-in-attn-linear": r.get("attention_bias", "bool"),
               "intermediate-size": r.get("intermediate_size", "count"), "activation": "gelu",
               "bias-gelu-fusion": act in GELU_TANH}
        src = {"layernorm-epsilon": "layer_norm_eps", "gpt-j-residual": "use_parallel_residual",
               "use-bias-in-attn-linear": "attention_bias", "intermediate-size": "intermediate_size",
               "bias-gelu-fusion": "hidden_act"}
        return out, src
