"""LlamaForCausalLM: RMSNorm, q/k/v/o projections (num_key_value_heads <-> num-kv-heads; our one
QKV matrix is [Q|K|V] with fewer kv heads, else per head [q_h|k_h|v_h]), SwiGLU from gate/up/down
(our first projection is [up | gate]), rotary on every channel, optional attention and MLP biases."""
from __future__ import annotations

import torch

from megatron.interop.state_dict_adapter import PARTS, Rule, StateDictAdapter

from .base import HFFamily
from .registry import register_family

SILU = ("silu", "swish")  # both nn.SiLU in transformers' ACT2CLS


class LlamaAdapter(StateDictAdapter):
    """Llama and Mistral (Mistral's block is Llama's with a sliding window: the same tensors)."""
    head = "lm_head.weight"

    def rules(self) -> list[Rule]:
        out = [Rule("word_embeddings.weight", ("model.embed_tokens.weight",))]
        for i in range(self.m.num_layers):
            ours, theirs = f"layers.{i}.", f"model.layers.{i}."
            out += [Rule(ours + "input_layernorm.weight", (theirs + "input_layernorm.weight",)),
                    Rule(ours + "post_attention_layernorm.weight", (theirs + "post_attention_layernorm.weight",))]
            for part in PARTS:
                out += [
                    Rule(ours + f"attention.query_key_value.{part}",
                         tuple(theirs + f"self_attn.{p}_proj.{part}" for p in "qkv"),
                         join=self._join_qkv, split=self._split_qkv, optional=True),
                    Rule(ours + f"attention.dense.{part}", (theirs + f"self_attn.o_proj.{part}",), optional=True),
                    Rule(ours + f"mlp.dense_h_to_4h.{part}", (theirs + f"mlp.up_proj.{part}", theirs + f"mlp.gate_proj.{part}"),
                         join=lambda up, gate: torch.cat([up, gate]), split=lambda t: t.chunk(2), optional=True),
                    Rule(ours + f"mlp.dense_4h_to_h.{part}", (theirs + f"mlp.down_proj.{part}",), optional=True),
                ]
        out.append(Rule("final_norm.weight", ("model.norm.weight",)))
        return out

    def _join_qkv(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q/k/v projections as our QKV: [Q | K | V] with fewer kv heads (NeoX's GQA layout), per head
        [q_h | k_h | v_h] for multi-head attention (NeoX's layout, which HF's GPTNeoX shares)."""
        if self.m.grouped_query:
            return torch.cat([q, k, v])
        H = self.m.num_attention_heads
        return torch.cat([t.unflatten(0, (H, -1)) for t in (q, k, v)], dim=1).flatten(0, 1)

    def _split_qkv(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        D, H, G = self.m.head_dim, self.m.num_attention_heads, self.m.kv_heads
        if self.m.grouped_query:
            return tuple(t.split([H * D, G * D, G * D]))
        q, k, v = t.unflatten(0, (H, 3 * D)).chunk(3, dim=1)
        return q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1)


@register_family
class Llama(HFFamily):
    arch, name, config_class, model_type = "LlamaForCausalLM", "Llama", "LlamaConfig", "llama"
    adapter_class = LlamaAdapter
    layers_prefix = "model.layers."
    defaults = {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
                "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": None,
                "hidden_act": "silu", "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
                "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
                "head_dim": None, "rope_theta": 10000.0}
    every_channel_rotary = True

    def claims(self, m) -> bool:
        return m.norm != "layernorm" and m.attention_window is None

    def lacks(self, m) -> list[str]:
        return [w for w, bad in (("parallel residual", m.gpt_j_residual),
                                 (f"activation {m.activation}", m.activation != "swiglu"),
                                 ("partial rotary", m.rotary_pct != 1.0)) if bad]

    def stock_config(self, m, common: dict, rope: dict) -> dict:
        return {**self._llama_config(m, common, rope), "attention_bias": m.use_bias_in_attn_linear,
                "mlp_bias": m.use_bias_in_mlp}

    def _llama_config(self, m, common: dict, rope: dict) -> dict:
        return {**common, "model_type": self.model_type,
                "intermediate_size": m.mlp_widths[1], "hidden_act": "silu", "rms_norm_eps": m.rms_norm_epsilon,
                "num_key_value_heads": m.kv_heads, "head_dim": m.head_dim, "rope_parameters": rope}

    def biases(self, r) -> tuple[bool, bool]:
        """(use-bias-in-attn-linear, use-bias-in-mlp) as config.json sets them."""
        return r.get("attention_bias", "bool"), r.get("mlp_bias", "bool")

    def neox_keys(self, r, heads: int) -> tuple[dict, dict]:
        act = r.get("hidden_act", "str")
        if act not in SILU:
            raise r.refuse("hidden_act", f"{act!r} is not imported ({r.cls}'s silu)")
        kv = r.get("num_key_value_heads", "count", nullable=True) or heads
        if heads % kv:
            raise r.refuse("num_key_value_heads", f"{kv} does not divide num_attention_heads {heads} (each "
                                                  "key/value head serves a whole group of query heads): this "
                                                  "config.json is damaged, or not the one the weights were saved with")
        eps = r.get("rms_norm_eps", "float")  # read in this order: the first bad key is the one refused
        attn_bias, mlp_bias = self.biases(r)
        # NeoX's rule gives halves of int(2/3 * size): size = 3 * HF's intermediate_size is exact.
        out = {"norm": "rmsnorm", "rms-norm-epsilon": eps, "use-bias-in-norms": False,
               "use-bias-in-attn-linear": attn_bias, "use-bias-in-mlp": mlp_bias, "activation": "swiglu",
               "intermediate-size": 3 * r.get("intermediate_size", "count"), "mlp-multiple-of": 1, "num-kv-heads": kv}
        src = {"rms-norm-epsilon": "rms_norm_eps", "use-bias-in-attn-linear": "attention_bias",
               "use-bias-in-mlp": "mlp_bias", "intermediate-size": "intermediate_size",
               "num-kv-heads": "num_key_value_heads"}
        return out, src
