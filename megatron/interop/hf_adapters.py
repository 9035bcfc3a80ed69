"""One state-dict adapter per Hugging Face family, each ONE name map read by both directions
(torchtitan's StateDictAdapter.from_hf / to_hf): a rule names our tensor, the stock class's
tensor(s), and for a tensor stored differently the pair of functions between the layouts.

    GPTNeoXForCausalLM            our names under `gpt_neox.` (NeoX's own module names, which HF kept)
    LlamaForCausalLM, Mistral...  embed_tokens / model.layers.{i}.self_attn.{q,k,v,o}_proj /
                                  mlp.{gate,up,down}_proj / model.norm; our one QKV matrix is split
                                  (NeoX's layouts: [Q | K | V] with fewer kv heads, else per head
                                  [q_h | k_h | v_h]), our first MLP projection is [up | gate]

Which model a class expresses, and its config.json, are megatron/interop/hf_stock.py's.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from megatron.errors import UserError

PARTS = ("weight", "bias")


@dataclass(frozen=True)
class Rule:
    """Our tensor `ours` <-> the foreign tensors `theirs` (one, or several joined into ours)."""
    ours: str
    theirs: tuple[str, ...]
    join: Callable | None = None  # theirs' tensors -> ours (None: the one tensor as it is)
    split: Callable | None = None  # ours -> theirs' tensors, in order
    optional: bool = False  # absent on both sides in some models (biases, an untied head)


class StateDictAdapter:
    """from_hf(weights) -> our GPTModel state; to_hf(state) -> the stock class's tensors."""

    head = ""  # the output matrix's foreign name (tied models may still save it)

    def __init__(self, model_cfg):
        self.m = model_cfg

    def rules(self) -> list[Rule]:
        raise NotImplementedError

    def _all_rules(self) -> list[Rule]:
        out = self.rules()
        if self.m.no_weight_tying:
            out.append(Rule("output_layer.weight", (self.head,)))
        return out

    def from_hf(self, weights: dict) -> dict:
        out, used = {}, set()
        for r in self._all_rules():
            present = [n in weights for n in r.theirs]
            if not all(present):
                if r.optional and not any(present):
                    continue
                missing = next(n for n, p in zip(r.theirs, present) if not p)
                raise UserError(f"the weights have no tensor {missing!r}, which this architecture needs; is "
                                "config.json the one these weights were saved with?")
            used.update(r.theirs)
            tensors = [weights[n] for n in r.theirs]
            out[r.ours] = r.join(*tensors) if r.join else tensors[0]
        used.add(self.head)  # a tied model may still save the (same) matrix
        left = [k for k in weights if k not in used and not k.endswith("rotary_emb.inv_freq")]
        if left:
            raise UserError(f"the weights hold tensors this architecture does not use: {left[:6]}"
                            f"{' ...' if len(left) > 6 else ''}; is config.json the one these weights were saved with?")
        return out

    def to_hf(self, state: dict) -> dict:
        out, used = {}, set()
        for r in self._all_rules():
            if r.ours not in state:
                if r.optional:
                    continue
                raise UserError(f"the model has no tensor {r.ours!r}, which {type(self).__name__} writes")
            used.add(r.ours)
            tensors = r.split(state[r.ours]) if r.split else (state[r.ours],)
            out.update(zip(r.theirs, tensors))
        left = [k for k in state if k not in used and not k.startswith("position.")]
        if left:  # a tensor the stock class has no place for would be dropped silently
            raise UserError(f"{type(self).__name__} has no place for the model's tensors {left[:6]}; export "
                            "this model with its remote code instead")
        return {k: v.contiguous() for k, v in out.items()}


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


ADAPTERS = {"GPTNeoXForCausalLM": GPTNeoXAdapter, "LlamaForCausalLM": LlamaAdapter, "MistralForCausalLM": LlamaAdapter}


def adapter(arch: str, model_cfg) -> StateDictAdapter:
    """The adapter of stock class `arch` for the model `model_cfg` describes."""
    return ADAPTERS[arch](model_cfg)
