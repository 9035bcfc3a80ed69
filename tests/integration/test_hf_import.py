"""Released models in (tools/import_hf.py): random-initialised Pythia-, Llama- and Mistral-shaped
Hugging Face models written with save_pretrained, imported, give HF's own perplexity on the same
windows (fp32, relative 1e-4); every file form save_pretrained writes (safetensors, sharded, .bin)
and dtype (nothing rounded); bad inputs get one line naming the problem and leave the output alone."""
import json
import os
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

from megatron.checkpoint.load_model import load_checkpoint_model  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

V, H, HEADS, L = 128, 32, 4, 40
SHAPES = {
    # Pythia: parallel residual, rotary on a quarter of each head, untied output
    "pythia": lambda: transformers.GPTNeoXConfig(
        vocab_size=V, hidden_size=H, num_hidden_layers=2, num_attention_heads=HEADS, intermediate_size=4 * H,
        rotary_pct=0.25, max_position_embeddings=64, use_parallel_residual=True, tie_word_embeddings=False,
        initializer_range=0.2),
    "neox-sequential-tanh": lambda: transformers.GPTNeoXConfig(
        vocab_size=V, hidden_size=H, num_hidden_layers=2, num_attention_heads=HEADS, intermediate_size=4 * H,
        rotary_pct=1.0, max_position_embeddings=64, use_parallel_residual=False, hidden_act="gelu_new",
        tie_word_embeddings=False, initializer_range=0.2),
    # Llama: grouped-query attention, SwiGLU, RMSNorm, tied and untied
    "llama-gqa-tied": lambda: transformers.LlamaConfig(
        vocab_size=V, hidden_size=H, num_hidden_layers=2, num_attention_heads=HEADS, num_key_value_heads=2,
        intermediate_size=48, max_position_embeddings=64, tie_word_embeddings=True, initializer_range=0.2,
        rope_theta=500000.0),
    "llama-mha-untied": lambda: transformers.LlamaConfig(
        vocab_size=V, hidden_size=H, num_hidden_layers=2, num_attention_heads=HEADS, num_key_value_heads=HEADS,
        intermediate_size=40, max_position_embeddings=64, tie_word_embeddings=False, initializer_range=0.2),
    # Mistral: Llama's block with an 8-key sliding window (shorter than the windows scored)
    "mistral-window": lambda: transformers.MistralConfig(
        vocab_size=V, hidden_size=H, num_hidden_layers=2, num_attention_heads=HEADS, num_key_value_heads=1,
        intermediate_size=48, max_position_embeddings=64, sliding_window=8, initializer_range=0.2),
}


def save_hf(tmp_path, shape, dtype=torch.float32, **save):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(SHAPES[shape]()).to(dtype).eval()
    path = tmp_path / f"hf_{shape}"
    model.save_pretrained(path, **save)
    return model, str(path)


def import_cli(src, out, *extra):
    return subprocess.run([sys.executable, "tools/import_hf.py", "--input", src, "--output", out, *extra],
                          cwd=ROOT, capture_output=True, text=True)


def import_here(src, out):
    """tools/import_hf.py's work in this process (the CLI's own tests below run it as a user does)."""
    from megatron.interop.hf_import import import_hf

    import_hf(src, out)


def perplexity_hf(model, tokens):
    with torch.no_grad():
        return torch.exp(model(tokens, labels=tokens).loss.float()).item()


def perplexity_ours(model, tokens):
    with torch.no_grad():
        return torch.exp(model.token_losses(tokens[:, :-1], tokens[:, 1:]).float().mean()).item()


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_imported_models_give_hf_s_perplexity(tmp_path, shape):
    hf, src = save_hf(tmp_path, shape)
    if shape == "pythia":  # the command as a user runs it, once
        proc = import_cli(src, str(tmp_path / "ck"))
        assert proc.returncode == 0 and "wrote" in proc.stdout and "parallel residual" in proc.stdout, proc.stderr
    else:
        import_here(src, str(tmp_path / "ck"))
    ours, cfg, client = load_checkpoint_model(str(tmp_path / "ck"))
    tokens = torch.randint(0, V, (3, L), generator=torch.Generator().manual_seed(1))
    ppl_hf, ppl_ours = perplexity_hf(hf, tokens), perplexity_ours(ours, tokens)
    assert abs(ppl_ours / ppl_hf - 1) < 1e-4, (ppl_ours, ppl_hf)
    assert ppl_hf > 1.5 * V ** 0.1  # not a degenerate model: the check above would be weak
    assert client["source_layout"].startswith("huggingface:")


def test_every_file_form_and_dtype_imports_without_rounding(tmp_path):
    from safetensors.torch import load_file

    hf, src = save_hf(tmp_path, "llama-gqa-tied", torch.bfloat16, max_shard_size="20KB")
    assert os.path.isfile(os.path.join(src, "model.safetensors.index.json"))  # sharded
    import_here(src, str(tmp_path / "ck"))
    blob = torch.load(tmp_path / "ck" / "global_step0" / "mp_rank_00_model_states.pt", weights_only=False)
    saved = {k: v for f in os.listdir(src) if f.endswith(".safetensors") for k, v in load_file(os.path.join(src, f)).items()}
    emb = blob["module"]["word_embeddings.weight"]
    assert emb.dtype == torch.bfloat16 and torch.equal(emb, saved["model.embed_tokens.weight"])

    _, bin_src = save_hf(tmp_path / "bin", "pythia", safe_serialization=False) if _has_bin_option() else (None, None)
    if bin_src is not None:
        assert import_cli(bin_src, str(tmp_path / "ck_bin")).returncode == 0


def _has_bin_option() -> bool:
    """transformers 5 may drop .bin writing; the .bin reader is then checked by test_bin_weights_only."""
    import inspect

    return "safe_serialization" in inspect.signature(transformers.PreTrainedModel.save_pretrained).parameters


def test_bin_weights_are_read_weights_only(tmp_path):
    hf, src = save_hf(tmp_path, "pythia")
    from safetensors.torch import load_file

    weights = load_file(os.path.join(src, "model.safetensors"))
    os.remove(os.path.join(src, "model.safetensors"))
    torch.save(weights, os.path.join(src, "pytorch_model.bin"))
    import_here(src, str(tmp_path / "ck"))
    ours, _, _ = load_checkpoint_model(str(tmp_path / "ck"))
    tokens = torch.randint(0, V, (2, L))
    assert abs(perplexity_ours(ours, tokens) / perplexity_hf(hf, tokens) - 1) < 1e-4
    torch.save({"w": torch.zeros(1), "code": print}, os.path.join(src, "pytorch_model.bin"))  # not weights-only
    proc = import_cli(src, str(tmp_path / "ck2"))
    assert proc.returncode != 0 and "not a weights-only torch file" in proc.stderr and "Traceback" not in proc.stderr


def test_the_tokenizer_travels(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    _, src = save_hf(tmp_path, "pythia")
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(V)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(os.path.join(src, "tokenizer.json"))
    import_here(src, str(tmp_path / "ck"))
    _, cfg, _ = load_checkpoint_model(str(tmp_path / "ck"))
    assert cfg.data.tokenizer_type == "HFTokenizer" and os.path.isfile(cfg.data.vocab_file)
    assert os.path.dirname(cfg.data.vocab_file) == str(tmp_path / "ck" / "tokenizer")


def test_a_sentencepiece_tokenizer_travels_as_spm(tmp_path):
    """Llama's tokenizer.model (no tokenizer.json beside it) -> SPMTokenizer, readable after import."""
    spm = pytest.importorskip("sentencepiece")
    from megatron.tokenizer import build_tokenizer
    from tests.unit.test_tokenizers import CORPUS

    _, src = save_hf(tmp_path, "llama-gqa-tied")
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS * 3), model_prefix=os.path.join(src, "tokenizer"),
                                   vocab_size=100, model_type="bpe", user_defined_symbols=["<|endoftext|>"],
                                   hard_vocab_limit=False, character_coverage=1.0, num_threads=1, minloglevel=2)
    import_here(src, str(tmp_path / "ck"))
    _, cfg, _ = load_checkpoint_model(str(tmp_path / "ck"))
    assert cfg.data.tokenizer_type == "SPMTokenizer"
    tok = build_tokenizer(cfg.data.tokenizer_type, cfg.data.vocab_file)
    assert tok.detokenize(tok.tokenize("def f(x): return x")) == "def f(x): return x"


@pytest.mark.parametrize("edit,message", [
    ({"architectures": ["GPT2LMHeadModel"]}, "architecture 'GPT2LMHeadModel' is not supported (config.json's architectures)"),
    ({"intermediate_size": 64}, "config.json: model.layers.0.mlp.up_proj.weight in model.safetensors has shape (40, 32), "
                               "config.json describes (64, 32)"),
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0}}, "config.json's rope_parameters.rope_type is "
                                                                 "'longrope' (LongRoPE's"),
])
def test_bad_hf_directories_get_one_line(tmp_path, edit, message):
    _, src = save_hf(tmp_path, "llama-mha-untied")
    path = os.path.join(src, "config.json")
    cfg = json.load(open(path))
    cfg.update(edit)
    json.dump(cfg, open(path, "w"))
    proc = import_cli(src, str(tmp_path / "ck"))
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not os.path.exists(tmp_path / "ck")


def test_an_existing_output_is_refused_untouched_unless_overwrite(tmp_path):
    _, src = save_hf(tmp_path, "pythia")
    out = tmp_path / "ck"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    proc = import_cli(src, str(out))
    assert proc.returncode != 0 and "--overwrite" in proc.stderr and (out / "keep.txt").read_text() == "mine"
    assert import_cli(src, str(out), "--overwrite").returncode == 0 and not (out / "keep.txt").exists()
    assert import_cli(src, src, "--overwrite").returncode != 0  # never into its own input
    assert os.path.isfile(os.path.join(src, "config.json"))


@pytest.mark.parametrize("shape", ["pythia", "neox-sequential-tanh", "llama-gqa-tied", "llama-mha-untied",
                                   "mistral-window"])
def test_export_writes_the_stock_class_that_loads_without_remote_code(tmp_path, shape):
    """import -> export: the stock class again, loaded by plain transformers (no trust_remote_code,
    no .py file in the directory), with our logits."""
    from megatron.interop.hf_export import export_hf

    _, src = save_hf(tmp_path, shape)
    import_here(src, str(tmp_path / "ck"))
    ours, cfg, _ = load_checkpoint_model(str(tmp_path / "ck"))
    if shape == "llama-gqa-tied":  # the command as a user runs it, once
        proc = subprocess.run([sys.executable, "tools/export_hf.py", "--checkpoint", str(tmp_path / "ck"),
                               "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True)
        assert proc.returncode == 0 and "LlamaForCausalLM" in proc.stdout, proc.stderr
    else:
        export_hf(ours, cfg, str(tmp_path / "out"))
    assert not [f for f in os.listdir(tmp_path / "out") if f.endswith(".py")]
    cls = json.load(open(tmp_path / "out" / "config.json"))["architectures"][0]
    assert cls == json.load(open(os.path.join(src, "config.json")))["architectures"][0]
    exported = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), dtype=torch.float32).eval()
    tokens = torch.randint(0, V, (2, L))
    with torch.no_grad():
        torch.testing.assert_close(exported(tokens).logits, ours(tokens), rtol=1e-5, atol=1e-5)


def test_a_kerple_llama_exports_as_remote_code_refusing_what_it_lacks(tmp_path):
    """No stock class has KERPLE: the remote-code model, which covers NeoX's classic block only, so
    a Llama-style KERPLE model is refused by name rather than exported as another model."""
    from megatron.config import load_config
    from megatron.errors import UserError
    from megatron.interop.hf_export import _check_supported
    from megatron.interop.hf_stock import stock_class
    from tests.conftest import TINY_MODEL, write_yaml

    cfg = load_config([write_yaml(tmp_path / "m.yml", TINY_MODEL),
                       os.path.join(ROOT, "configs", "quickstart_llama_kerple.yml")]).model
    arch, why = stock_class(cfg)
    assert arch is None and "pos-emb kerple_log" in why
    with pytest.raises(UserError, match="num-kv-heads 2"):
        _check_supported(cfg)
