"""Export a checkpoint (ours or NeoX/KERPLE) as a Hugging Face model directory:

    config.json              KerpleConfig (model_type kerple_neox) + auto_map for trust_remote_code
    model.safetensors        our state_dict unchanged (names match hf_modeling/modeling_kerple.py)
    configuration_kerple.py, modeling_kerple.py, positions_kerple.py   the remote code
    tokenizer files          HFTokenizer (tokenizer.json) or GPT2BPETokenizer (vocab.json + merges.txt)

    AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)

The remote code implements every scheme of megatron/positional (KERPLE included) and windowed
attention, and uses HF's kv-cache in generate()."""
from __future__ import annotations

import json
import os
import shutil

from megatron.config.precision import torch_dtype
from megatron.errors import UserError

TEMPLATE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_modeling")
REMOTE_FILES = ("configuration_kerple.py", "modeling_kerple.py", "positions_kerple.py")


def hf_config(mcfg, vocab_size: int, dtype: str = "fp32", tokenizer=None) -> dict:
    cfg = {
        "model_type": "kerple_neox", "architectures": ["KerpleForCausalLM"],
        "auto_map": {"AutoConfig": "configuration_kerple.KerpleConfig",
                     "AutoModelForCausalLM": "modeling_kerple.KerpleForCausalLM"},
        "vocab_size": vocab_size, "hidden_size": mcfg.hidden_size, "num_hidden_layers": mcfg.num_layers,
        "num_attention_heads": mcfg.num_attention_heads,
        "intermediate_size": mcfg.intermediate_size or 4 * mcfg.hidden_size,
        "max_position_embeddings": mcfg.max_position_embeddings or mcfg.seq_length,
        "pos_emb": mcfg.pos_emb, "rotary_pct": mcfg.rotary_pct, "rotary_emb_base": mcfg.rotary_emb_base,
        "rpe_num_buckets": mcfg.rpe_num_buckets, "rpe_max_distance": mcfg.rpe_max_distance,
        "attention_window": mcfg.attention_window, "norm": mcfg.norm,
        "layernorm_epsilon": mcfg.layernorm_epsilon, "rms_norm_epsilon": mcfg.rms_norm_epsilon,
        "use_bias_in_norms": mcfg.use_bias_in_norms, "use_bias_in_attn_linear": mcfg.use_bias_in_attn_linear,
        "use_bias_in_mlp": mcfg.use_bias_in_mlp, "tie_output_to_embedding": not mcfg.no_weight_tying,
        "tie_word_embeddings": False, "dtype": str(torch_dtype(dtype)).replace("torch.", ""),
    }
    if tokenizer is not None:
        cfg.update(eos_token_id=tokenizer.eod, bos_token_id=tokenizer.eod, pad_token_id=tokenizer.eod)
    return cfg


def _check_supported(mcfg) -> None:
    if mcfg.gpt_j_residual:
        raise UserError("gpt-j-residual models cannot be exported yet (the remote code is sequential "
                         "pre-LN); export a model trained with gpt-j-residual: false")
    if mcfg.activation != "gelu":
        raise UserError(f"activation {mcfg.activation!r} cannot be exported; the remote code uses GELU")


def save_tokenizer(cfg, out_dir: str) -> str | None:
    """Write HF tokenizer files when the training tokenizer has an HF equivalent; else None."""
    d = cfg.data
    try:
        if d.tokenizer_type == "HFTokenizer" and d.vocab_file:
            from transformers import PreTrainedTokenizerFast

            tok = PreTrainedTokenizerFast(tokenizer_file=d.vocab_file)
        elif d.tokenizer_type == "GPT2BPETokenizer" and d.vocab_file and d.merge_file:
            from transformers import GPT2TokenizerFast

            tok = GPT2TokenizerFast(vocab_file=d.vocab_file, merges_file=d.merge_file)
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


def export_hf(model, cfg, out_dir: str, dtype: str = "fp32", tokenizer: bool = True) -> dict:
    """Write the HF directory for a loaded GPTModel and its config; returns a summary dict."""
    from safetensors.torch import save_file

    _check_supported(cfg.model)
    os.makedirs(out_dir, exist_ok=True)
    tok_obj = None
    if cfg.data.tokenizer_type:
        from megatron.tokenizer import build_tokenizer

        try:
            tok_obj = build_tokenizer(cfg.data.tokenizer_type, cfg.data.vocab_file, cfg.data.merge_file)
        except (ValueError, OSError):
            tok_obj = None  # the tokenizer files are elsewhere: ids still export, names do not
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hf_config(cfg.model, model.vocab_size, dtype, tok_obj), f, indent=2)
    for name in REMOTE_FILES:
        shutil.copy(os.path.join(TEMPLATE_DIR, name), os.path.join(out_dir, name))
    state = {k: v.detach().to(torch_dtype(dtype)).contiguous().clone() for k, v in model.state_dict().items()
             if not k.endswith("_extra_state")}
    for k in ("position.inv_freq", "position.slopes"):  # derived buffers stay exact in fp32
        if k in state:
            state[k] = model.state_dict()[k].float().contiguous().clone()
    weights = os.path.join(out_dir, "model.safetensors")
    save_file(state, weights, metadata={"format": "pt"})
    os.chmod(weights, 0o666 & ~_umask())  # safetensors creates it 0600; every other file follows the umask
    tok_type = save_tokenizer(cfg, out_dir) if tokenizer else None
    return {"out": out_dir, "tensors": len(state), "tokenizer": tok_type, "pos_emb": cfg.model.pos_emb}
