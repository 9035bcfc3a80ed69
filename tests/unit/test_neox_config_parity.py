"""The parameter count `deepy.py --dry-run` prints (megatron/model/size.py: one layer built on meta) equals
Hugging Face's for every model shape of NeoX's own configs: Pythia 14M-12B and GPT-NeoX-20B
(GPTNeoXForCausalLM: parallel residual, rotary on 25% of each head, untied embeddings, biases),
Llama 1 and 2, CodeLlama (LlamaForCausalLM: RMSNorm, SwiGLU, no biases, GQA for the large ones)
and Mistral 7B (MistralForCausalLM).

How it is checked, for each shape:
- SHAPES holds the keys that define it as NeoX's file gives them (layers, hidden, heads, kv heads,
  intermediate-size, mlp-multiple-of, activation, norm, biases, tying, rotary-pct, gpt-j-residual,
  model-parallel-size and make-vocab-size-divisible-by with the tokenizer's raw size); the test
  checks these against the verbatim file in tests/fixtures/neox_configs (no transcription error),
  writes them as a config and loads it with load_config.
- The Hugging Face side comes from the released model's config.json (its intermediate_size: the
  MLP's per-half width for Llama/Mistral, and its vocab_size), independent of our code; NeoX's
  vocabulary padding (tokenizer size rounded up to divisible-by x model-parallel-size) must give
  that vocab_size and NeoX's MLP sizing rule must give that width.
- The HF model is built on the meta device (no memory, well under a second each) and its
  parameters() are summed; so is our GPTModel's, also on meta. Our count must equal both, in total
  and for the embeddings alone. The positional scheme is no difference: NeoX's rotary (ours) has no
  parameters and HF's rotary inv_freq is a buffer, not a parameter (both asserted).
Where NeoX's files do not build the released model, the HF model takes the shape the file builds:
- llama2/ (codellama included) and mistral/ do not set use_bias_in_mlp, whose NeoX default is true:
  NeoX builds MLP biases that Llama 2, CodeLlama and Mistral do not have (llama/ sets it false).
  LlamaConfig(mlp_bias=True) has them too. HF's Mistral class has no such option, so for Mistral
  our config sets use-bias-in-mlp: false (the released model's shape).
- the codellama files set no intermediate-size, so NeoX's rule builds 4 x hidden -> per-half
  widths 5632 (7B) and 11008 (34B), half of CodeLlama's 11008 and 22016; the HF model has NeoX's.
- mistral/7B.yml gives 14336 (HF's per-half width), which NeoX's rule cannot build (the loader
  refuses it); the test uses 3 x 14336 = 43008, which gives HF's width.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch
import yaml

from megatron.config import load_config
from megatron.tokenizer import padded_vocab_size
from tests.conftest import ROOT

transformers = pytest.importorskip("transformers")
NEOX = os.path.join(ROOT, "tests", "fixtures", "neox_configs")
PYTHIA_TOKENS, LLAMA_TOKENS = 50277, 32000  # the 20B tokenizer's and Llama's sentencepiece sizes


@dataclass(frozen=True)
class Shape:
    file: str  # NeoX's config file (tests/fixtures/neox_configs)
    layers: int
    hidden: int
    heads: int
    hf_width: int  # HF config.json intermediate_size (the MLP's inner width; a half for SwiGLU)
    hf_vocab: int  # HF config.json vocab_size
    tp: int  # NeoX file's model-parallel-size: pads the vocabulary to 128 x tp for Pythia
    kv_heads: int | None = None
    neox_width: int | None = None  # NeoX file's intermediate-size (None: not set, NeoX takes 4 x hidden)
    tokens: int = PYTHIA_TOKENS  # the tokenizer's raw size

    @property
    def family(self) -> str:
        return self.file.split("/")[0] if "/" in self.file else "pythia"

    @property
    def file_mlp_bias(self) -> bool:
        """NeoX's file leaves use_bias_in_mlp at NeoX's default (true) except in llama/."""
        return self.family in ("pythia", "llama2", "mistral")


SHAPES = [
    Shape("pythia/14M.yml", 6, 128, 4, 512, 50304, 1),
    Shape("pythia/70M.yml", 6, 512, 8, 2048, 50304, 1),
    Shape("pythia/160M.yml", 12, 768, 12, 3072, 50304, 1),
    Shape("pythia/410M.yml", 24, 1024, 16, 4096, 50304, 1),
    Shape("pythia/1B.yml", 16, 2048, 8, 8192, 50304, 1),
    Shape("pythia/1-4B.yml", 24, 2048, 16, 8192, 50304, 1),
    Shape("pythia/2-8B.yml", 32, 2560, 32, 10240, 50304, 1),
    Shape("pythia/6-9B.yml", 32, 4096, 32, 16384, 50432, 2),
    Shape("pythia/12B.yml", 36, 5120, 40, 20480, 50688, 4),
    Shape("20B.yml", 44, 6144, 64, 24576, 50432, 2),
    Shape("llama/7B.yml", 32, 4096, 32, 11008, 32000, 1, neox_width=32768, tokens=LLAMA_TOKENS),
    Shape("llama/13B.yml", 40, 5120, 40, 13824, 32000, 2, neox_width=40960, tokens=LLAMA_TOKENS),
    Shape("llama/30B.yml", 60, 6656, 52, 17920, 32000, 4, neox_width=53248, tokens=LLAMA_TOKENS),
    Shape("llama/65B.yml", 80, 8192, 64, 22016, 32000, 8, neox_width=65536, tokens=LLAMA_TOKENS),
    Shape("llama2/7B.yml", 32, 4096, 32, 11008, 32000, 1, neox_width=32768, tokens=LLAMA_TOKENS),
    Shape("llama2/13B.yml", 40, 5120, 40, 13824, 32000, 2, neox_width=41472, tokens=LLAMA_TOKENS),
    Shape("llama2/70B.yml", 80, 8192, 64, 28672, 32000, 1, kv_heads=8, neox_width=86016, tokens=LLAMA_TOKENS),
    # NeoX's codellama files give no intermediate-size: 4 x hidden, half CodeLlama's width (docstring)
    Shape("llama2/codellama_7B.yml", 32, 4096, 32, 5632, 32016, 1, tokens=32016),
    Shape("llama2/codellama_34B.yml", 48, 8192, 64, 11008, 32000, 1, kv_heads=8, tokens=LLAMA_TOKENS),
    Shape("mistral/7B.yml", 32, 4096, 32, 14336, 32000, 1, kv_heads=8, neox_width=3 * 14336, tokens=LLAMA_TOKENS),
]


def neox_keys(s: Shape) -> dict:
    """The keys of NeoX's file that define the shape (underscore spelling, as most of its files)."""
    keys = {"num_layers": s.layers, "hidden_size": s.hidden, "num_attention_heads": s.heads,
            "model_parallel_size": s.tp, "pos_emb": "rotary", "no_weight_tying": True}
    if s.family == "pythia":  # NeoX's classic block: LayerNorm and biases (defaults), tanh GELU
        return {**keys, "rotary_pct": 0.25, "gpt_j_residual": True, "bias_gelu_fusion": True}
    keys.update({"rotary_pct": 1, "gpt_j_residual": False, "norm": "rmsnorm", "activation": "swiglu",
                 "use_bias_in_norms": False, "use_bias_in_attn_linear": False, "bias_gelu_fusion": False,
                 "make_vocab_size_divisible_by": 1})
    if s.family == "llama":  # llama/ also says use_bias_in_mlp: False (llama2/, mistral/ do not)
        keys["use_bias_in_mlp"] = False
    if s.family != "mistral":  # mistral/7B.yml leaves mlp_multiple_of at NeoX's default 1
        keys["mlp_multiple_of"] = 256
    if s.kv_heads:
        keys["num_kv_heads"] = s.kv_heads
    if s.neox_width:
        keys["intermediate_size"] = s.neox_width
    return keys


def neox_file(name: str) -> dict:
    with open(os.path.join(NEOX, name), encoding="utf-8") as f:
        return {k.replace("-", "_"): v for k, v in yaml.safe_load(f).items()}


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.file)
def test_shape_facts_are_neox_files_own(shape):
    raw = neox_file(shape.file)
    for key, value in neox_keys(shape).items():
        if key == "intermediate_size" and shape.family == "mistral":
            assert raw[key] == 14336  # the file's stale per-half value, fixed here (docstring)
            continue
        assert raw.get(key) == value, (key, raw.get(key), value)
    assert ("use_bias_in_mlp" not in raw) == shape.file_mlp_bias  # absent: NeoX's default, biases
    if shape.neox_width is None:
        assert "intermediate_size" not in raw  # NeoX then takes 4 x hidden


def hf_model(s: Shape, vocab: int):
    t = transformers
    common = {"vocab_size": vocab, "hidden_size": s.hidden, "num_hidden_layers": s.layers,
              "num_attention_heads": s.heads, "intermediate_size": s.hf_width, "tie_word_embeddings": False}
    if s.family == "pythia":
        cfg = t.GPTNeoXConfig(**common, rotary_pct=0.25, use_parallel_residual=True, hidden_act="gelu_fast")
        cls = t.GPTNeoXForCausalLM
    elif s.family == "mistral":
        cfg, cls = t.MistralConfig(**common, num_key_value_heads=s.kv_heads, sliding_window=4096), t.MistralForCausalLM
    else:
        cfg = t.LlamaConfig(**common, num_key_value_heads=s.kv_heads or s.heads, attention_bias=False,
                            mlp_bias=s.file_mlp_bias)
        cls = t.LlamaForCausalLM
    with torch.device("meta"):
        return cls(cfg)


def hf_embeddings(model) -> int:
    return model.get_input_embeddings().weight.numel() + model.get_output_embeddings().weight.numel()


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.file)
def test_parameter_count_equals_hugging_face(shape, tmp_path):
    from megatron.model import GPTModel, count_parameters

    divisible = 128 if shape.family == "pythia" else 1
    vocab = padded_vocab_size(shape.tokens, divisible, shape.tp)
    assert vocab == shape.hf_vocab  # NeoX's padding gives the released vocabulary
    path = tmp_path / "shape.yml"
    mistral_fix = {"use_bias_in_mlp": False} if shape.family == "mistral" else {}  # HF's Mistral has none (docstring)
    path.write_text(yaml.safe_dump({**neox_keys(shape), **mistral_fix, "seq_length": 2048, "padded_vocab_size": vocab,
                                    "train_iters": 10, "train_micro_batch_size_per_gpu": 1}))
    m = load_config([str(path)]).model
    assert m.mlp_widths[1] == shape.hf_width  # NeoX's sizing rule gives HF's width

    hf = hf_model(shape, vocab)
    assert not any("rotary" in n for n, _ in hf.named_parameters())  # inv_freq is a buffer
    assert any(n.endswith("inv_freq") for n, _ in hf.named_buffers())
    terms = GPTModel.parameter_terms(m, vocab)
    assert terms["max_position_embeddings"] == 0  # NeoX's rotary has no parameters either
    assert terms["padded_vocab_size"] == hf_embeddings(hf)
    ours = GPTModel.parameter_count(m, vocab)
    assert ours == sum(p.numel() for p in hf.parameters())
    with torch.device("meta"):
        assert ours == count_parameters(GPTModel(m, vocab))
