"""A Hugging Face model directory (what transformers' save_pretrained writes) -> a TP=1 checkpoint
of this stack that evaluate.py, generate.py, tools/export_hf.py and `load:` (finetune: true) read.

Supported classes and what each becomes (NeoX keys, written into the checkpoint's config):

    GPTNeoXForCausalLM   Pythia, GPT-NeoX-20B: layernorm, per-head [q|k|v] QKV with biases, rotary
                         on rope_parameters' partial_rotary_factor of each head, use_parallel_residual
                         -> gpt-j-residual, hidden_act gelu (exact) or its tanh forms -> bias-gelu-fusion
    LlamaForCausalLM     RMSNorm, q/k/v/o projections (num_key_value_heads -> num-kv-heads; the
                         projections concatenated in our [Q|K|V] or per-head layout), SwiGLU from
                         gate/up/down (our first projection is [up | gate]), rotary on every channel
    MistralForCausalLM   Llama's block with sliding_window W: keys i-W < j <= i -> attention-window W

Weights are read whole from model.safetensors, its sharded index, or weights-only pytorch_model.bin
(sharded too), in the dtype they were saved in: nothing is rounded. A tied model has no output
matrix (tie_word_embeddings: our tied output layer). The tokenizer travels: tokenizer.json ->
HFTokenizer, tokenizer.model -> SPMTokenizer, copied beside the checkpoint."""
from __future__ import annotations

import json
import os

import torch

from megatron.errors import UserError
from megatron.interop.hf_stock import GELU_TANH, from_hf

SUPPORTED = ("GPTNeoXForCausalLM", "LlamaForCausalLM", "MistralForCausalLM")
TOKENIZER_DIR = "tokenizer"


def read_hf_config(hf_dir: str) -> dict:
    path = os.path.join(hf_dir, "config.json")
    if not os.path.isfile(path):
        raise UserError(f"{hf_dir}: no config.json; give a directory written by transformers' save_pretrained")
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError, RecursionError) as e:  # RecursionError: JSON nested thousands deep
        raise UserError(f"{path}: not a readable JSON config ({type(e).__name__}: {e})") from None
    arch = (cfg.get("architectures") or [None])[0]
    if arch not in SUPPORTED:
        raise UserError(f"{path}: architecture {arch!r} is not supported; this importer reads "
                        f"{', '.join(SUPPORTED)}")
    return cfg


def _rope(hf: dict, path: str) -> tuple[float, float]:
    """(rope theta, partial rotary factor) from rope_parameters (transformers 5) or the older keys."""
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise UserError(f"{path}: rope_type {kind!r} is not imported (only the default RoPE); evaluate the "
                        "imported model with rotary-scaling (linear / ntk / yarn) instead")
    theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    partial = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", hf.get("rotary_pct", 1.0)))
    return float(theta), float(partial)


def neox_keys(hf: dict, hf_dir: str) -> dict:
    """The NeoX config keys of the HF model's architecture (model section only)."""
    arch, path = hf["architectures"][0], os.path.join(hf_dir, "config.json")
    h, heads = hf["hidden_size"], hf["num_attention_heads"]
    if hf.get("head_dim") not in (None, h // heads) or h % heads:
        raise UserError(f"{path}: head_dim {hf.get('head_dim')} is not hidden_size / num_attention_heads "
                        f"({h} / {heads}); this stack's heads split the hidden size")
    theta, partial = _rope(hf, path)
    if theta != int(theta):
        raise UserError(f"{path}: rope_theta {theta} is not a whole number; NeoX's rotary-emb-base is an integer")
    seq = hf.get("max_position_embeddings", 2048)
    out = {"num-layers": hf["num_hidden_layers"], "hidden-size": h, "num-attention-heads": heads,
           "seq-length": seq, "max-position-embeddings": seq, "pos-emb": "rotary", "rotary-pct": partial,
           "rotary-emb-base": int(theta), "padded-vocab-size": hf["vocab_size"], "make-vocab-size-divisible-by": 1,
           "no-weight-tying": not hf.get("tie_word_embeddings", arch != "GPTNeoXForCausalLM")}
    if arch == "GPTNeoXForCausalLM":
        act = hf.get("hidden_act", "gelu")
        if act not in ("gelu", *GELU_TANH):
            raise UserError(f"{path}: hidden_act {act!r} is not imported for GPTNeoX (gelu or its tanh forms)")
        out.update({"norm": "layernorm", "layernorm-epsilon": hf.get("layer_norm_eps", 1e-5),
                    "gpt-j-residual": bool(hf.get("use_parallel_residual", True)),
                    "use-bias-in-attn-linear": bool(hf.get("attention_bias", True)),
                    "intermediate-size": hf.get("intermediate_size", 4 * h), "activation": "gelu",
                    "bias-gelu-fusion": act in GELU_TANH})
    else:
        if hf.get("hidden_act", "silu") != "silu":
            raise UserError(f"{path}: hidden_act {hf.get('hidden_act')!r} is not imported (Llama's silu)")
        # NeoX's rule gives halves of int(2/3 * size): size = 3 * HF's intermediate_size is exact.
        out.update({"norm": "rmsnorm", "rms-norm-epsilon": hf.get("rms_norm_eps", 1e-6), "use-bias-in-norms": False,
                    "use-bias-in-attn-linear": bool(hf.get("attention_bias", False)),
                    "use-bias-in-mlp": bool(hf.get("mlp_bias", False)), "activation": "swiglu",
                    "intermediate-size": 3 * hf["intermediate_size"], "mlp-multiple-of": 1,
                    "num-kv-heads": hf.get("num_key_value_heads") or heads})
        if arch == "MistralForCausalLM" and hf.get("sliding_window"):
            # transformers' sliding mask keeps kv_idx > q_idx - sliding_window: W keys, our window.
            out["attention-window"] = hf["sliding_window"]
    return out


def read_weights(hf_dir: str) -> dict:
    """{HF name: tensor} from safetensors (single or sharded) or weights-only .bin files."""
    names = os.listdir(hf_dir)
    if "model.safetensors.index.json" in names or "model.safetensors" in names:
        from safetensors.torch import load_file

        files = _shards(hf_dir, "model.safetensors")
        return {k: v for f in files for k, v in load_file(f).items()}
    if "pytorch_model.bin.index.json" in names or "pytorch_model.bin" in names:
        out = {}
        for f in _shards(hf_dir, "pytorch_model.bin"):
            try:
                out.update(torch.load(f, map_location="cpu", weights_only=True))
            except Exception as e:  # noqa: BLE001 - a pickle with code in it, or not a torch file
                raise UserError(f"{f}: not a weights-only torch file ({type(e).__name__}); this importer does "
                                "not unpickle code: re-save it with save_pretrained(safe_serialization=True)") from None
        return out
    raise UserError(f"{hf_dir}: no model.safetensors, pytorch_model.bin or their sharded index; give a "
                    "directory written by save_pretrained")


def _shards(hf_dir: str, single: str) -> list[str]:
    index = os.path.join(hf_dir, single + ".index.json")
    if not os.path.isfile(index):
        return [os.path.join(hf_dir, single)]
    with open(index, encoding="utf-8") as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    missing = [x for x in files if not os.path.isfile(os.path.join(hf_dir, x))]
    if missing:
        raise UserError(f"{index} names shard files that are not there: {missing[:4]}")
    return [os.path.join(hf_dir, x) for x in files]


def check_shapes(state: dict, model) -> None:
    """Every tensor fits the model the config describes, else one message naming them."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    bad = [f"{k}: weights {tuple(t.shape)}, config {expected[k]}" for k, t in state.items()
           if k in expected and tuple(t.shape) != expected[k]]
    missing = [k for k in expected if k not in state and not k.startswith("position.")]
    if bad or missing:
        raise UserError("the weights do not fit config.json: " + "; ".join(bad[:6] + [f"{k} missing" for k in missing[:6]]))


def tokenizer_keys(hf_dir: str, output_dir: str) -> tuple[dict, dict]:
    """(NeoX tokenizer keys, {file under the output: source}) for the tokenizer files found; the
    config names the copy beside the checkpoint by its absolute path (configs are read from any
    working directory). None found: no tokenizer keys (pre-tokenized data still evaluates)."""
    if os.path.isfile(os.path.join(hf_dir, "tokenizer.json")):
        name, kind = "tokenizer.json", "HFTokenizer"
    elif os.path.isfile(os.path.join(hf_dir, "tokenizer.model")):
        name, kind = "tokenizer.model", "SPMTokenizer"
    else:
        return {}, {}
    rel = os.path.join(TOKENIZER_DIR, name)
    return ({"tokenizer-type": kind, "vocab-file": os.path.join(os.path.abspath(output_dir), rel)},
            {rel: os.path.join(hf_dir, name)})


def import_hf(hf_dir: str, output_dir: str, overwrite: bool = False) -> tuple[str, object]:
    """Write the HF model in `hf_dir` as our TP=1 checkpoint `output_dir` (step 0); returns (the
    step directory, its NeoXConfig). Everything is checked before anything is written."""
    from megatron.checkpoint.client import model_args
    from megatron.checkpoint.output import check_output
    from megatron.checkpoint.writer import write_checkpoint
    from megatron.config import load_config
    from megatron.model import GPTModel

    check_output(output_dir, overwrite, hf_dir, "the Hugging Face model being read (--input)")
    hf = read_hf_config(hf_dir)
    tok, files = tokenizer_keys(hf_dir, output_dir)
    flat = {**neox_keys(hf, hf_dir), **tok, "train-iters": 0, "train_micro_batch_size_per_gpu": 1}
    cfg = load_config([], flat)
    weights = read_weights(hf_dir)
    with torch.device("meta"):
        described = GPTModel(cfg.model, hf["vocab_size"])
    state = from_hf(hf["architectures"][0], weights, cfg.model)
    check_shapes(state, described)
    fresh = GPTModel(cfg.model, hf["vocab_size"])  # the scheme's derived buffers (rotary inv_freq)
    state.update({k: v for k, v in fresh.state_dict().items() if k.startswith("position.")})
    client = {"iteration": 0, "args": model_args(cfg, hf["vocab_size"]), "config": cfg.to_flat_dict(),
              "imported_from": os.path.abspath(hf_dir), "source_layout": "huggingface:" + hf["architectures"][0]}
    header = f"imported from the Hugging Face model {hf_dir} ({hf['architectures'][0]})"
    step = write_checkpoint(state, client, cfg, output_dir, "global_step0", overwrite, header, hf_dir,
                            extra_files=files)
    return step, cfg
