"""A Hugging Face model's config.json -> this stack's NeoX keys, each key read as transformers reads it.

config.json comes from the Hub, i.e. from anyone: it is untrusted input, like a checkpoint or a
YAML file. Its keys fall in four groups, decided from transformers 5's configuration_*.py and
modeling_*.py of each class (and transformers 4's spellings, which Hub configs of the Pythia era
still carry):

- mapped: a key the forward pass depends on, turned into a NeoX key, its value checked for JSON type
  and range. An absent key takes transformers' default for that class (GPTNeoX's rotary_pct is 0.25,
  Mistral's sliding_window 4096), so the import computes what transformers computes;
- inert: keys no forward pass reads (ids of special tokens, dropout, initialisation, caching);
- refused by name: keys that change the model in a way this stack cannot express (quantization,
  remote code, a RoPE type or parameter this stack does not compute as transformers does:
  hf_rope_scaling.py), and spellings of one setting that disagree (transformers 4's
  rotary_emb_base and transformers 5's rope_parameters.rope_theta), since transformers 4 and 5 would
  then build different models;
- anything else: a key neither transformers' class nor its model reads; transformers keeps it as an
  attribute and ignores it, so does the import, and says so in one note.

tests/integration/test_hf_untrusted.py compares these tables with transformers' own classes.
"""
from __future__ import annotations

import os
import re

from megatron.config.untrusted_json import json_type, read_json
from megatron.errors import UserError
from megatron.interop.hf_families import families, family
from megatron.interop.hf_rope_scaling import import_rope, rope_type

SUPPORTED = tuple(families())  # the stock classes, each a file of megatron/interop/hf_families/
MAX_CONFIG_BYTES = 4 << 20  # Hub configs are a few KiB; a classifier's id2label may add some

# Read by no forward pass of these classes (PreTrainedConfig's own fields included). dtype is
# checked against the weights by hf_weights.py; generation settings are popped by transformers.
INERT = frozenset({
    "architectures", "model_type", "transformers_version", "_name_or_path", "name_or_path", "_commit_hash",
    "dtype", "torch_dtype", "use_cache", "initializer_range", "bos_token_id", "eos_token_id", "pad_token_id",
    "sep_token_id", "decoder_start_token_id", "attention_dropout", "hidden_dropout", "classifier_dropout",
    "output_hidden_states", "output_attentions", "return_dict", "torchscript", "chunk_size_feed_forward",
    "is_encoder_decoder", "is_decoder", "id2label", "label2id", "num_labels", "problem_type", "tokenizer_class",
    "pretraining_tp",  # transformers 4 split Llama's matmuls into this many slices: the same products
    "attn_implementation", "_attn_implementation", "use_return_dict", "gradient_checkpointing", "max_length",
    "min_length", "do_sample", "num_beams", "temperature", "top_k", "top_p", "repetition_penalty",
    "prefix", "task_specific_params", "finetuning_task", "tie_encoder_decoder", "add_cross_attention",
})
REFUSED = {
    "quantization_config": "the weights are quantized (their values mean something only with that method's "
                           "kernels); import the unquantized release of the model",
    "per_layer_config": "layers differ from each other (a heterogeneous model); every layer of this stack has "
                        "the same shape",
    "auto_map": "the model is remote code (Python shipped with it), which may compute something other than the "
                "stock class named in architectures; this importer reads the stock classes only",
    "pruned_heads": "attention heads were pruned from some layers; every layer of this stack has all its heads",
}


def read_hf_config(hf_dir: str) -> dict:
    """config.json of `hf_dir`, a JSON object naming a supported architecture."""
    path = os.path.join(hf_dir, "config.json")
    if not os.path.isfile(path):
        raise UserError(f"{hf_dir}: no config.json; give a directory written by transformers' save_pretrained")
    try:
        cfg = read_json(path, "a JSON config", MAX_CONFIG_BYTES, fix="give the config.json the model was saved with")
    except OSError as e:
        raise UserError(f"{path}: not a readable JSON config ({e})") from None
    archs = cfg.get("architectures")
    arch = archs[0] if isinstance(archs, list) and len(archs) == 1 else archs
    if arch not in SUPPORTED:
        raise UserError(f"{path}: architecture {arch!r} is not supported (config.json's architectures); this "
                        f"importer reads {', '.join(SUPPORTED)}")
    return cfg


class _Reader:
    """Typed reads of config.json's keys, remembering which were read (the rest: INERT, or a note)."""

    def __init__(self, hf: dict, path: str, arch: str):
        self.hf, self.path, self.arch, self.read, self.notes = hf, path, arch, set(), []
        self.family = family(arch)
        self.cls = self.family.config_class

    def where(self, key: str) -> str:
        return f"{self.path}'s {key}"

    def refuse(self, key: str, why: str) -> UserError:
        return UserError(f"{self.where(key)} {why}")

    def get(self, key: str, kind: str, nullable: bool = False):
        """The value of `key` (transformers' default when absent), checked to be of `kind`:
        count (integer >= 1), float, bool, str, object. `nullable`: null is a value of its
        own (num_key_value_heads: null means 'as many as the heads'). `float`: a number written with
        a decimal point or exponent, as transformers' strict config classes require of the epsilons
        (they refuse 7, so this does too: the two never read one file differently)."""
        self.read.add(key)
        value = self.hf.get(key, self.family.defaults.get(key))
        if value is None and (nullable or key not in self.hf):
            return None
        ok = {"count": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
              "float": lambda v: isinstance(v, float) and 0 < v < float("inf"),
              "bool": lambda v: isinstance(v, bool), "str": lambda v: isinstance(v, str),
              "object": lambda v: isinstance(v, dict)}[kind](value)
        if not ok:
            want = {"count": "a whole number >= 1",
                    "float": "a number > 0 written as a float (1e-05, 7.0)", "bool": "true or false",
                    "str": "a string", "object": "an object"}[kind]
            raise self.refuse(key, f"is {json_type(value)} ({str(value)[:40]}); transformers' {self.cls} needs "
                                   f"{want}{' or null' if nullable else ''}: is this config.json damaged?")
        return value


def model_keys(hf: dict, hf_dir: str) -> tuple[dict, dict, list[str]]:
    """(NeoX model keys, {NeoX key: the config.json key it came from}, notes) for config `hf`."""
    arch, path = hf["architectures"][0], os.path.join(hf_dir, "config.json")
    r = _Reader(hf, path, arch)
    for key, why in REFUSED.items():
        if hf.get(key):
            raise r.refuse(key, f"is set: {why}")
    h, heads = r.get("hidden_size", "count"), r.get("num_attention_heads", "count")
    if h % heads:
        raise r.refuse("num_attention_heads", f"{heads} does not divide hidden_size {h}; transformers' {r.cls} "
                                              "refuses this config too")
    head_dim = r.get("head_dim", "count", nullable=True)
    if head_dim not in (None, h // heads):
        raise r.refuse("head_dim", f"{head_dim} is not hidden_size / num_attention_heads ({h} / {heads}); this "
                                   "stack's heads split the hidden size")
    theta, partial, rope, rope_key, kind = _rope(r, h // heads)
    seq = r.get("max_position_embeddings", "count")
    scaling, scaling_src, r.notes = import_rope(r, rope, rope_key, kind, int(h // heads * partial), h // heads, seq)
    src = {"num-layers": "num_hidden_layers", "hidden-size": "hidden_size", "num-attention-heads":
           "num_attention_heads", "seq-length": "max_position_embeddings", "max-position-embeddings":
           "max_position_embeddings", "rotary-pct": "partial_rotary_factor", "rotary-emb-base": "rope_theta",
           "padded-vocab-size": "vocab_size", "no-weight-tying": "tie_word_embeddings"}
    out = {"num-layers": r.get("num_hidden_layers", "count"), "hidden-size": h, "num-attention-heads": heads,
           "seq-length": seq, "max-position-embeddings": seq, "pos-emb": "rotary", "rotary-pct": partial,
           "rotary-emb-base": theta, "padded-vocab-size": r.get("vocab_size", "count"),
           "make-vocab-size-divisible-by": 1, "no-weight-tying": not r.get("tie_word_embeddings", "bool"), **scaling}
    src.update(scaling_src)
    own, own_src = r.family.neox_keys(r, heads)  # the family's keys: norm, MLP, biases, kv heads, window
    out.update(own)
    src.update(own_src)
    return out, src, _notes(r)


def _rope(r: _Reader, head_dim: int) -> tuple[int, float, dict, str, str]:
    """(rotary-emb-base, rotary-pct, the RoPE dict, its key, its type) as transformers reads them
    (the type's own parameters: hf_rope_scaling.py): rope_scaling, else rope_parameters
    (transformers 5), whose rope_theta / partial_rotary_factor come first; then GPTNeoX's
    rotary_emb_base / rotary_pct, or the other classes' top-level rope_theta; then the class's
    default. Every other spelling present must agree with the value used, or it is refused by name."""
    scaling, params = r.get("rope_scaling", "object", True), r.get("rope_parameters", "object", True)
    if scaling and params and scaling != params:
        raise r.refuse("rope_scaling", f"{scaling} and its rope_parameters {params} disagree (transformers 5 "
                                       "reads rope_scaling): keep one")
    rope, rope_key = (scaling, "rope_scaling") if scaling else (params or {}, "rope_parameters")
    kind = rope_type(r, rope, rope_key)
    values = {}
    for name in ("rope_theta", "partial_rotary_factor"):
        # the spellings transformers reads, first wins; then those it ignores for this class (the
        # other families' spellings of the same setting: GPTNeoX's rotary_emb_base for Llama)
        own = r.family.rope_spellings[name]
        others = sorted({f.rope_spellings[name] for f in families().values()} - {own})
        read = [(f"{rope_key}.{name}", rope, name), (own, r.hf, own)]
        ignored = [(other, r.hf, other) for other in others]
        r.read.update({name, own, *others})
        # present with null is not absent: transformers then computes with None and fails
        present = [(label, where[k]) for label, where, k in read if k in where]
        for k, v in present + [(label, where[key]) for label, where, key in ignored if key in where]:
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf")):
                raise r.refuse(k, f"is {json_type(v)} ({str(v)[:40]}); transformers' {r.cls} needs a number > 0")
        ignored = [(label, where[key]) for label, where, key in ignored if key in where]
        if name == "partial_rotary_factor" and r.family.every_channel_rotary:
            used = 1.0  # Llama's and Mistral's rotary turns every channel, whatever the config says
        else:
            used = float(present[0][1]) if present else r.family.defaults[name]
        for k, v in present + ignored:
            if float(v) != used:
                raise r.refuse(k, f"is {v}, but transformers' {r.arch} ignores it and uses {used} ({_spellings(r, name)}): "
                                  "the config is ambiguous (transformers 4 and 5, or this file's author and "
                                  "transformers, disagree); keep one spelling with the value the model was trained with")
        values[name] = used
    theta, partial = values["rope_theta"], values["partial_rotary_factor"]
    if theta != int(theta):
        raise r.refuse("rope_theta", f"{theta} is not a whole number; NeoX's rotary-emb-base is an integer")
    if partial > 1 or int(head_dim * partial) % 2 or int(head_dim * partial) == 0:
        raise r.refuse(_spellings(r, "partial_rotary_factor").split(" / ")[0],
                       f"{partial} turns int({head_dim} * {partial}) = {int(head_dim * partial)} channels of each "
                       "head: not an even number from 2 to the head size, which rotary needs")
    return int(theta), partial, rope, rope_key, kind


def _spellings(r: _Reader, name: str) -> str:
    return f"rope_parameters.{name} / {r.family.rope_spellings[name]}"


def _notes(r: _Reader) -> list[str]:
    unknown = sorted(k for k in r.hf if k not in r.read and k not in INERT and k not in REFUSED)
    if not unknown:
        return r.notes
    return r.notes + [f"{r.path}: {', '.join(unknown[:8])}{' ...' if len(unknown) > 8 else ''}: neither transformers' "
            f"{r.cls} nor its model reads {'these keys' if len(unknown) > 1 else 'this key'}; ignored, as "
            "transformers ignores them"]


_CONFIG_LINE = re.compile(r"- ([\w-]+) = (.*) \(from -o on the command line\)")


def name_hf_keys(message: str, path: str, src: dict) -> str:
    """A ConfigError of the NeoX keys made from config.json, its lines naming the config.json key
    each came from instead of '-o on the command line' (the user wrote no -o)."""
    def one(m):
        hf_key = src.get(m.group(1))
        return (f"- {m.group(1)} = {m.group(2)} (from {path}'s {hf_key})" if hf_key
                else f"- {m.group(1)} = {m.group(2)} (set by the importer for {path})")
    return _CONFIG_LINE.sub(one, message)
