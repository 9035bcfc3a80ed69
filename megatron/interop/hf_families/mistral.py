"""MistralForCausalLM: Llama's block (the same tensors: LlamaAdapter) with attention-window
W = sliding_window (transformers' sliding mask keeps kv_idx > q_idx - W: keys i-W < j <= i, our
window) and no biases."""
from __future__ import annotations

from .llama import Llama
from .registry import register_family


@register_family
class Mistral(Llama):
    arch, name, config_class, model_type = "MistralForCausalLM", "Mistral", "MistralConfig", "mistral"
    defaults = {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
                "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                "head_dim": None, "hidden_act": "silu", "max_position_embeddings": 131072,
                "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "sliding_window": 4096,
                "rope_theta": 10000.0}

    def claims(self, m) -> bool:
        return m.norm != "layernorm" and m.attention_window is not None

    def lacks(self, m) -> list[str]:
        why = super().lacks(m)
        if m.use_bias_in_attn_linear or m.use_bias_in_mlp:
            why.append("biases with a sliding window")
        return why

    def stock_config(self, m, common: dict, rope: dict) -> dict:
        return {**self._llama_config(m, common, rope), "sliding_window": m.attention_window}

    def biases(self, r) -> tuple[bool, bool]:
        # transformers' MistralConfig has no attention_bias / mlp_bias, so bias tensors in its
        # weights are extra tensors (refused by hf_weights.py), never used; the keys stay unread
        return False, False

    def neox_keys(self, r, heads: int) -> tuple[dict, dict]:
        out, src = super().neox_keys(r, heads)
        window = r.get("sliding_window", "count", nullable=True)
        if window is not None:
            out["attention-window"] = window
            src["attention-window"] = "sliding_window"
        return out, src
