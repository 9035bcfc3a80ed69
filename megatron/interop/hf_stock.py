"""Transformers' stock classes and this stack's model: which of our models a stock class expresses,
and its config.json. What each family expresses, its own config keys and its tensors (both ways)
are its file in megatron/interop/hf_families/; this module holds what they share.

RoPE scaling (rotary-scaling linear, dynamic, yarn, llama3) travels as transformers' rope type of
that name (hf_rope_scaling.py), in both directions; a model it cannot express has no stock class.

tools/import_hf.py reads them (megatron/interop/hf_import.py); tools/export_hf.py writes them
(megatron/interop/hf_export.py) whenever `stock_class` finds one, else the remote-code model."""
from __future__ import annotations

from megatron.interop.hf_families import families, family
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
    claimed = next(f for f in families().values() if f.claims(m))  # one family per block shape
    why = claimed.lacks(m)
    return (None, f"{claimed.name} lacks " + ", ".join(why)) if why else (claimed.arch, "")


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
    return family(arch).stock_config(m, common, rope)
