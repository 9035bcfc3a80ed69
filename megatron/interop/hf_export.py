"""Export a checkpoint (ours or NeoX/KERPLE) as a Hugging Face model directory:

    config.json              KerpleConfig (model_type kerple_neox) + auto_map for trust_remote_code
    model.safetensors        our state_dict unchanged (names match hf_modeling/modeling_kerple.py)
    configuration_kerple.py, modeling_kerple.py   the remote model code (hf_modeling/)
    base.py, registry.py, <scheme>.py, ...        megatron/positional's own files the scheme needs
    mask.py                                       megatron/attention/mask.py: the causal/window/padding rule
    positional_scheme.py                          names the scheme class for modeling_kerple.py
    tokenizer files          HFTokenizer (tokenizer.json) or GPT2BPETokenizer (vocab.json + merges.txt)

    AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)

The remote code runs the training code's own positional scheme (no second copy of any formula;
a new scheme file exports with no change here) and windowed attention, and uses HF's kv-cache in
generate()."""
from __future__ import annotations

import ast
import dataclasses
import importlib
import json
import os
import shutil

import torch
from safetensors.torch import save_file

from megatron.atomic_io import atomic_directory, refuse_existing_output
from megatron.config.precision import torch_dtype
from megatron.errors import UserError
from megatron.interop.hf_families import adapter
from megatron.interop.hf_stock import stock_class, stock_config
from megatron.positional.base import positional_spec
from megatron.positional.registry import scheme_class
from megatron.tokenizer import build_tokenizer
from megatron.tokenizer.hf import EOD_TOKEN

TEMPLATE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_modeling")
REMOTE_FILES = ("configuration_kerple.py", "modeling_kerple.py")
# Our own modules the remote code imports as they are (each imports torch only): the one mask
# rule (causal, window, padded rows) and the attention_mask -> row starts conversion. mask.py
# reads positions' host marks from the positional package's distance.py, which every export
# ships (base.py imports it), so there it imports it relatively.
SHARED_FILES = {"mask.py": os.path.join(os.path.dirname(TEMPLATE_DIR), os.pardir, "attention", "mask.py")}
POSITIONAL_PACKAGE = "megatron.positional"
SCHEME_FILE = "positional_scheme.py"  # written per export: which class modeling_kerple.py builds


def hf_config(model_cfg, vocab_size: int, dtype: str = "fp32", tokenizer=None) -> dict:
    cfg = {
        "model_type": "kerple_neox", "architectures": ["KerpleForCausalLM"],
        "auto_map": {"AutoConfig": "configuration_kerple.KerpleConfig",
                     "AutoModelForCausalLM": "modeling_kerple.KerpleForCausalLM"},
        "vocab_size": vocab_size, "hidden_size": model_cfg.hidden_size, "num_hidden_layers": model_cfg.num_layers,
        "num_attention_heads": model_cfg.num_attention_heads,
        "intermediate_size": model_cfg.intermediate_size or 4 * model_cfg.hidden_size,
        "max_position_embeddings": model_cfg.max_position_embeddings or model_cfg.seq_length,
        "pos_emb": model_cfg.pos_emb, "rotary_pct": model_cfg.rotary_pct, "rotary_emb_base": model_cfg.rotary_emb_base,
        "rpe_num_buckets": model_cfg.rpe_num_buckets, "rpe_max_distance": model_cfg.rpe_max_distance,
        "attention_window": model_cfg.attention_window, "norm": model_cfg.norm,
        "layernorm_epsilon": model_cfg.layernorm_epsilon, "rms_norm_epsilon": model_cfg.rms_norm_epsilon,
        "use_bias_in_norms": model_cfg.use_bias_in_norms, "use_bias_in_attn_linear": model_cfg.use_bias_in_attn_linear,
        "use_bias_in_mlp": model_cfg.use_bias_in_mlp, "tie_output_to_embedding": not model_cfg.no_weight_tying,
        "tie_word_embeddings": False, "dtype": str(torch_dtype(dtype)).replace("torch.", ""),
        "positional_spec": _spec_fields(model_cfg),
    }
    if tokenizer is not None:
        cfg.update(eos_token_id=tokenizer.eod, bos_token_id=tokenizer.eod, pad_token_id=tokenizer.eod)
    return cfg


def _spec_fields(model_cfg) -> dict:
    """The full-model (TP=1) PositionalSpec the remote code builds its scheme from."""
    spec = dataclasses.asdict(positional_spec(model_cfg))
    for key in ("tp_rank", "tp_size"):
        del spec[key]
    return spec


def positional_sources(pos_emb: str) -> dict[str, str]:
    """{file name: path} of the megatron/positional files scheme `pos_emb` needs: its own module
    and, transitively, every module it imports relatively (plus base and registry, which the
    remote code imports). They are copied flat next to modeling_kerple.py."""
    todo = [scheme_class(pos_emb).__module__, f"{POSITIONAL_PACKAGE}.base", f"{POSITIONAL_PACKAGE}.registry"]
    files: dict[str, str] = {}
    while todo:
        module = importlib.import_module(todo.pop())
        path = module.__file__
        name = os.path.basename(path)
        if name in files:
            continue
        if name in REMOTE_FILES + (SCHEME_FILE, *SHARED_FILES):
            raise UserError(f"{path}: a positional scheme file cannot be named {name} (the Hugging Face "
                            "export writes a file of that name); rename it")
        files[name] = path
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:  # from .x import y / from . import x
                names = [node.module] if node.module else [alias.name for alias in node.names]
                todo.extend(f"{POSITIONAL_PACKAGE}.{n}" for n in names)
                continue
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                absolute = [node.module]
            elif isinstance(node, ast.Import):
                absolute = [alias.name for alias in node.names]
            else:
                continue
            if any(n.split(".")[0] == "megatron" for n in absolute):
                raise UserError(f"{path}:{node.lineno} imports megatron by its absolute name; the Hugging "
                                "Face export ships this file without the megatron package, so import "
                                "the positional package's modules relatively (from .base import ...)")
    return files


def write_positional_files(pos_emb: str, out_dir: str) -> list[str]:
    """Copy the scheme's positional files into out_dir and name its class in positional_scheme.py."""
    files = positional_sources(pos_emb)
    for name, path in files.items():
        shutil.copy(path, os.path.join(out_dir, name))
    cls = scheme_class(pos_emb)
    module = cls.__module__.rsplit(".", 1)[1]
    with open(os.path.join(out_dir, SCHEME_FILE), "w") as f:
        f.write(f'"""The positional scheme of this model, pos-emb {pos_emb!r} (written by the export)."""\n'
                f"from .{module} import {cls.__name__} as SCHEME_CLASS\n\n__all__ = [\"SCHEME_CLASS\"]\n")
    return sorted(files) + [SCHEME_FILE]


def _check_supported(model_cfg, stock_why: str = "") -> None:
    """The remote code (hf_modeling/) is NeoX's classic block: sequential pre-LN, multi-head, an
    exact-GELU MLP. A model of another block shape is refused by name, never exported as a
    different model; `stock_why`: why no stock class expresses it either (hf_stock.stock_class)."""
    unsupported = []
    if model_cfg.gpt_j_residual:
        unsupported.append("gpt-j-residual: true (parallel residual)")
    if model_cfg.activation != "gelu" or model_cfg.gated_mlp:
        unsupported.append(f"activation {model_cfg.activation!r}")
    elif model_cfg.bias_gelu_fusion or model_cfg.onnx_safe:
        unsupported.append("the tanh (bias-gelu-fusion) or onnx-safe GELU")
    if model_cfg.grouped_query:
        unsupported.append(f"num-kv-heads {model_cfg.num_kv_heads} (grouped-query attention)")
    if model_cfg.mlp_widths != (model_cfg.intermediate_size, model_cfg.intermediate_size):
        unsupported.append(f"MLP widths {model_cfg.mlp_widths} rounded by mlp-multiple-of {model_cfg.mlp_multiple_of}")
    if unsupported:
        stock = f"no stock transformers class expresses it ({stock_why}), and " if stock_why else ""
        raise UserError(f"this model cannot be exported to Hugging Face yet: {stock}the remote code is NeoX's "
                        "classic block (sequential pre-LN, multi-head attention, exact-GELU MLP of width "
                        f"intermediate-size), and the model has {'; '.join(unsupported)}")


def save_tokenizer(cfg, out_dir: str) -> str | None:
    """Write HF tokenizer files when the training tokenizer has an HF equivalent; else None."""
    d = cfg.data
    # eod as eos/bos, as config.json says: tools that read the tokenizer alone (the harness's `hf`
    # model: its end-of-text and empty-context prefix token) need them named. And as pad: a batch of
    # prompts needs one (tokenizer(prompts, padding=True) refuses without it), on the left so every
    # row's generation starts right after its own prompt (the remote code honours attention_mask).
    # Given to the constructor: attributes set later are not saved.
    special = dict(eos_token=EOD_TOKEN, bos_token=EOD_TOKEN, pad_token=EOD_TOKEN, padding_side="left")
    try:
        if d.tokenizer_type == "HFTokenizer" and d.vocab_file:
            from transformers import PreTrainedTokenizerFast  # lazy: transformers (~0.7 s) only to save a tokenizer

            tok = PreTrainedTokenizerFast(tokenizer_file=d.vocab_file, **special)
        elif d.tokenizer_type == "GPT2BPETokenizer" and d.vocab_file and d.merge_file:
            from transformers import GPT2TokenizerFast  # lazy: as above

            tok = GPT2TokenizerFast(vocab_file=d.vocab_file, merges_file=d.merge_file, **special)
        else:
            return None
    except OSError as e:
        raise UserError(f"cannot read the tokenizer files of the checkpoint's config ({e}); pass "
                         "-o vocab-file=<path> (and merge-file) or --no-tokenizer") from e
    tok.save_pretrained(out_dir)
    return d.tokenizer_type


def _umask() -> int:
    mask = os.umask(0)  # the only way to read it is to set it
    os.umask(mask)
    return mask


def export_hf(model, cfg, out_dir: str, dtype: str = "fp32", tokenizer: bool = True, overwrite: bool = False) -> dict:
    """Write the HF directory for a loaded GPTModel and its config; returns a summary dict. The
    directory is written whole (temporary directory, then renamed): an earlier export there is
    refused unless `overwrite`, and then replaced entirely, so none of its files (an old tokenizer,
    a scheme file the new model does not use) survive next to the new weights."""
    arch, why = stock_class(cfg.model)
    if arch is None:
        _check_supported(cfg.model, why)
    refuse_existing_output(out_dir, overwrite, "--out")
    os.makedirs(os.path.dirname(os.path.abspath(out_dir)), exist_ok=True)
    with atomic_directory(out_dir) as tmp:
        info = _write_stock(model, cfg, tmp, dtype, tokenizer, arch) if arch else \
            _write_export(model, cfg, tmp, dtype, tokenizer)
    return {**info, "out": out_dir}


def _write_stock(model, cfg, out_dir: str, dtype: str, tokenizer: bool, arch: str) -> dict:
    """A stock transformers class (megatron/interop/hf_stock.py): config.json and weights, no code;
    AutoModelForCausalLM.from_pretrained(out) loads it without trust_remote_code."""
    tok_obj = _tokenizer_of(cfg)
    hf_cfg = stock_config(arch, cfg.model, model.vocab_size, str(torch_dtype(dtype)).replace("torch.", ""))
    if tok_obj is not None:
        hf_cfg.update(eos_token_id=tok_obj.eod, bos_token_id=tok_obj.eod, pad_token_id=tok_obj.eod)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hf_cfg, f, indent=2)
    state = {k: v.detach().to("cpu", torch_dtype(dtype)).clone() for k, v in model.state_dict().items()
             if not k.endswith("_extra_state") and not k.startswith("position.")}
    weights = os.path.join(out_dir, "model.safetensors")
    save_file(adapter(arch, cfg.model).to_hf(state), weights, metadata={"format": "pt"})
    os.chmod(weights, 0o666 & ~_umask())
    tok_type = save_tokenizer(cfg, out_dir) if tokenizer else None
    return {"out": out_dir, "tensors": len(state), "tokenizer": tok_type, "pos_emb": cfg.model.pos_emb,
            "class": arch}


def _tokenizer_of(cfg):
    if not cfg.data.tokenizer_type:
        return None

    try:
        return build_tokenizer(cfg.data.tokenizer_type, cfg.data.vocab_file, cfg.data.merge_file)
    except (ValueError, OSError):
        return None  # the tokenizer files are elsewhere: ids still export, names do not


def _write_export(model, cfg, out_dir: str, dtype: str, tokenizer: bool) -> dict:
    tok_obj = _tokenizer_of(cfg)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hf_config(cfg.model, model.vocab_size, dtype, tok_obj), f, indent=2)
    for name in REMOTE_FILES:
        shutil.copy(os.path.join(TEMPLATE_DIR, name), os.path.join(out_dir, name))
    for name, path in SHARED_FILES.items():
        shutil.copy(os.path.normpath(path), os.path.join(out_dir, name))
    write_positional_files(cfg.model.pos_emb, out_dir)
    # On the CPU whatever device the model was loaded on: the files are the same either way.
    state = {k: v.detach().to("cpu", torch_dtype(dtype)).contiguous().clone() for k, v in model.state_dict().items()
             if not k.endswith("_extra_state")}
    for k in ("position.inv_freq", "position.slopes"):  # derived buffers stay exact in fp32
        if k in state:
            state[k] = model.state_dict()[k].to("cpu", torch.float32).contiguous().clone()
    weights = os.path.join(out_dir, "model.safetensors")
    save_file(state, weights, metadata={"format": "pt"})
    os.chmod(weights, 0o666 & ~_umask())  # safetensors creates it 0600; every other file follows the umask
    tok_type = save_tokenizer(cfg, out_dir) if tokenizer else None
    return {"out": out_dir, "tensors": len(state), "tokenizer": tok_type, "pos_emb": cfg.model.pos_emb,
            "class": "KerpleForCausalLM (remote code)"}
