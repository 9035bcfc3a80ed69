"""A Hugging Face model directory (what transformers' save_pretrained writes) -> a TP=1 checkpoint
of this stack that evaluate.py, generate.py, tools/export_hf.py and `load:` (finetune: true) read.

Supported classes and what each becomes (NeoX keys, written into the checkpoint's config): one
file per family in megatron/interop/hf_families/ (GPTNeoX: Pythia, GPT-NeoX-20B; Llama; Mistral).

RoPE scaling (config.json's rope_scaling / rope_parameters: linear, dynamic, yarn, llama3) becomes
the rotary-scaling keys computing what transformers computes (hf_rope_scaling.py); any other type,
or a parameter value this stack would compute differently, is refused by name.

Weights are read whole from model.safetensors, its sharded index, or weights-only pytorch_model.bin
(sharded too), in the dtype they were saved in: nothing is rounded. A tied model has no output
matrix (tie_word_embeddings: our tied output layer). The tokenizer travels: tokenizer.json ->
HFTokenizer, tokenizer.model -> SPMTokenizer, copied beside the checkpoint.

Everything read comes from the Hub, i.e. from anyone: config.json key by key (hf_config.py),
every weight file's header and tensor list against it (hf_weights.py, safetensors_file.py) and the
tokenizer against the embedding (hf_tokenizer.py), all before a byte of weights is read; a refusal
is one UserError naming the file and key, and writes nothing (the output is published whole, last)."""
from __future__ import annotations

import os

import torch

from megatron.checkpoint.client import model_args
from megatron.checkpoint.finite import nonfinite_tensors
from megatron.checkpoint.output import check_output
from megatron.checkpoint.writer import write_checkpoint
from megatron.config import load_config
from megatron.errors import UserError
from megatron.interop.hf_config import SUPPORTED, model_keys, name_hf_keys, read_hf_config
from megatron.interop.hf_families import adapter
from megatron.interop.hf_tokenizer import check_vocab, find_tokenizer, token_count, tokenizer_keys
from megatron.interop.hf_weights import WeightFiles, check_against, check_config_dtype
from megatron.model import GPTModel
from megatron.positional.base import positional_spec
from megatron.positional.registry import build_scheme

__all__ = ["SUPPORTED", "import_hf", "read_hf_config"]


def _config(flat: dict, config_path: str, src: dict):
    """load_config of the NeoX keys made from config.json; its refusals name config.json's keys."""
    try:
        return load_config([], flat)
    except UserError as e:
        raise type(e)(f"{config_path} describes a model this stack refuses: "
                      + name_hf_keys(str(e), config_path, src)) from None


def _position_buffers(model_cfg) -> dict:
    """The positional scheme's derived buffers (rotary inv_freq) as GPTModel holds them, without
    building (and randomly initialising) the whole model."""
    scheme = build_scheme(model_cfg.pos_emb, positional_spec(model_cfg))
    return {f"position.{k}": v for k, v in scheme.state_dict().items()}


def import_hf(hf_dir: str, output_dir: str, overwrite: bool = False) -> tuple[str, object]:
    """Write the HF model in `hf_dir` as our TP=1 checkpoint `output_dir` (step 0); returns (the
    step directory, its NeoXConfig). Everything is checked before anything is written."""
    check_output(output_dir, overwrite, hf_dir, "the Hugging Face model being read (--input)")
    hf = read_hf_config(hf_dir)
    config_path, arch = os.path.join(hf_dir, "config.json"), hf["architectures"][0]
    keys, src, notes = model_keys(hf, hf_dir)
    config_dtype = check_config_dtype(hf, config_path)
    weights = WeightFiles(hf_dir)  # headers only: no tensor data read yet
    if weights.layers() != keys["num-layers"]:
        raise UserError(f"{config_path}'s num_hidden_layers is {keys['num-layers']}, but the weights ({weights.files()}) "
                        f"hold {weights.layers()} layers: is config.json the one these weights were saved with?")
    found = find_tokenizer(hf_dir)
    tok, files = tokenizer_keys(found, output_dir)
    cfg = _config({**keys, **tok, "train-iters": 0, "train_micro_batch_size_per_gpu": 1}, config_path, src)
    vocab = keys["padded-vocab-size"]
    with torch.device("meta"):
        described = GPTModel(cfg.model, vocab)
    expected = adapter(arch, cfg.model).to_hf(described.state_dict())
    notes += check_against(weights, expected, arch, not cfg.model.no_weight_tying, config_path, config_dtype)
    if found is not None:
        emb = next(iter(expected))  # to_hf names the embedding first
        notes.append(check_vocab(found[0], token_count(*found), vocab,
                                 f"{config_path}'s vocab_size; tensor {emb} in {os.path.basename(weights.where[emb])}"))
    tensors = weights.read()
    bad = nonfinite_tensors(tensors, 4)
    if bad:  # a flipped exponent bit reads as inf/NaN; evaluate.py would refuse the checkpoint later
        raise UserError(f"the weights hold NaN or inf in {', '.join(bad)} (in {os.path.basename(weights.where[bad[0]])}): "
                        "a damaged download or copy, or a model saved after it diverged: download it again")
    state = adapter(arch, cfg.model).from_hf(tensors)
    state.update(_position_buffers(cfg.model))
    client = {"iteration": 0, "args": model_args(cfg, vocab), "config": cfg.to_flat_dict(),
              "imported_from": os.path.abspath(hf_dir), "source_layout": "huggingface:" + arch,
              "tokenizer": None if found is None else os.path.basename(found[0])}
    header = f"imported from the Hugging Face model {hf_dir} ({arch})"
    step = write_checkpoint(state, client, cfg, output_dir, "global_step0", overwrite, header, hf_dir,
                            extra_files=files)
    for note in notes:
        print(f"[import] note: {note}" if not note.startswith("tokenizer:") else f"[import] {note}", flush=True)
    if found is None:
        print(f"[import] note: {hf_dir} has no tokenizer.json or tokenizer.model: the checkpoint has no tokenizer "
              "(evaluate.py reads pre-tokenized data; generate.py needs -o tokenizer-type=... -o vocab-file=...)",
              flush=True)
    return step, cfg
