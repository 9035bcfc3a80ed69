"""Hugging Face export: AutoModelForCausalLM(trust_remote_code=True) on the exported directory (a
stock class for rotary, the remote-code model for the other schemes) reproduces our logits (fp32,
1e-4) and its greedy generate() (HF kv-cache) equals ours, for unpadded and padded batches
(attention_mask: left and right padding, batched generate)."""
import os

import pytest
import torch

from megatron.config import load_config
from megatron.model import GPTModel
from tests.conftest import train_config_dict, write_yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")


def _hf_roundtrip(model, cfg, out, prompt_len=6, new=12):
    from megatron.generation import generate_tokens
    from megatron.interop.hf_export import export_hf

    info = export_hf(model, cfg, str(out))
    if "remote code" in info["class"]:
        _check_positional_files(out)
    else:  # a stock class (rotary): plain transformers, no code in the directory
        assert not [f for f in os.listdir(out) if f.endswith(".py")], info
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), trust_remote_code=True, dtype=torch.float32).eval()
    torch.manual_seed(1)
    tokens = torch.randint(1, 100, (2, 20))
    with torch.no_grad():
        ours, theirs = model(tokens), hf(tokens).logits
    torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-4)
    prompt = tokens[:1, :prompt_len]
    expect = generate_tokens(model, prompt[0].tolist(), new, greedy=True)
    got = hf.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False, use_cache=True,
                      attention_mask=torch.ones_like(prompt), pad_token_id=0, eos_token_id=None)
    assert got[0, prompt_len:].tolist() == expect
    _check_padded(model, hf, tokens)


def _check_padded(model, hf, tokens, lengths=(20, 9), new=5):
    """attention_mask with left and right padding: each row's real tokens get our logits for that
    sequence alone; a left-padded batched generate() equals our greedy decoding of each prompt."""
    from megatron.generation import generate_tokens

    seqs = [tokens[b, :n] for b, n in enumerate(lengths)]
    L = max(lengths)
    left, right = torch.zeros(len(seqs), L, dtype=torch.long), torch.zeros(len(seqs), L, dtype=torch.long)
    left_mask, right_mask = torch.zeros_like(left), torch.zeros_like(right)
    for b, s in enumerate(seqs):
        left[b, L - len(s):], left_mask[b, L - len(s):] = s, 1
        right[b, :len(s)], right_mask[b, :len(s)] = s, 1
    with torch.no_grad():
        alone = [model(s[None])[0] for s in seqs]
        from_left = hf(left, attention_mask=left_mask).logits
        from_right = hf(right, attention_mask=right_mask).logits
    for b, s in enumerate(seqs):
        torch.testing.assert_close(from_left[b, L - len(s):], alone[b], rtol=0, atol=1e-4)
        torch.testing.assert_close(from_right[b, :len(s)], alone[b], rtol=0, atol=1e-4)
    got = hf.generate(left, attention_mask=left_mask, max_new_tokens=new,
                      min_new_tokens=new, do_sample=False, use_cache=True, pad_token_id=0, eos_token_id=None)
    for b, s in enumerate(seqs):
        assert got[b, L:].tolist() == generate_tokens(model, s.tolist(), new, greedy=True), b


def _check_positional_files(out):
    """The remote code runs megatron/positional's own files (and megatron/attention/mask.py), byte
    for byte, not a copy of the math."""
    import megatron.attention as attention
    import megatron.positional as package

    shipped = {f for f in os.listdir(out) if f.endswith(".py")} - {
        "configuration_kerple.py", "modeling_kerple.py", "positional_scheme.py"}
    assert {"base.py", "distance_kernel.py", "registry.py", "mask.py"} <= shipped
    for name in shipped:
        home = attention.__path__[0] if name == "mask.py" else package.__path__[0]
        with open(os.path.join(home, name), "rb") as ours, open(out / name, "rb") as theirs:
            assert ours.read() == theirs.read(), name


def test_trained_kerple_log_export(tmp_path, token_dataset):
    from megatron.checkpoint.load_model import load_checkpoint_model
    from megatron.training.trainer import Trainer

    ck = str(tmp_path / "ck")
    data = train_config_dict(tmp_path, token_dataset, train_iters=4, save=ck, save_interval=4)
    Trainer(load_config([write_yaml(tmp_path / "t.yml", data)])).train()
    model, cfg, _ = load_checkpoint_model(ck)
    _hf_roundtrip(model, cfg, tmp_path / "hf")
    files = set(os.listdir(tmp_path / "hf"))
    assert {"config.json", "model.safetensors", "modeling_kerple.py", "configuration_kerple.py"} <= files


@pytest.mark.parametrize("pos,window", [("alibi", None), ("rotary", None), ("rpe", None),
                                        ("kerple_power_ap_ap", None), ("kerple_log", 5), ("learned", None),
                                        ("sinusoidal", None), ("kerple_log_3para", None),
                                        ("kerple_power_original", None), ("none", None), ("fire", None),
                                        ("sandwich", None), ("xpos", None)])
def test_every_scheme_exports(tmp_path, tiny_config, pos, window):
    torch.manual_seed(0)
    cfg = tiny_config(pos_emb=pos, attention_window=window)
    model = GPTModel(cfg.model, 128).eval()
    with torch.no_grad():  # move scheme parameters off their init so a wrong mapping shows
        for p in model.position.parameters():
            p.mul_(1.3)
    _hf_roundtrip(model, cfg, tmp_path / "hf")


@pytest.mark.parametrize("window", [None, 5])
def test_fire_exports_with_its_options(tmp_path, tiny_config, window):
    """FIRE with a threshold below the test length, so its bias depends on the query position: the
    export must carry fire-init-threshold and HF's kv-cache must feed each new token its own i."""
    torch.manual_seed(0)
    cfg = tiny_config(pos_emb="fire", fire_init_threshold=2.0, fire_mlp_width=8, attention_window=window)
    model = GPTModel(cfg.model, 128).eval()
    with torch.no_grad():
        for p in model.position.parameters():
            p.mul_(3.0)
    assert model.position.out_weight.shape[1] == 8
    _hf_roundtrip(model, cfg, tmp_path / "hf")


@pytest.mark.parametrize("pos", ["kerple_log", "sandwich"])
def test_logn_scaling_exports(tmp_path, tiny_config, pos):
    """attention-logn-scaling reaches the remote code (logn.py ships with base.py; the switch and
    seq-length ride in positional_spec): 20-token inputs and generation past seq-length 8."""
    import json

    torch.manual_seed(0)
    cfg = tiny_config(pos_emb=pos, seq_length=8, attention_logn_scaling=True)
    model = GPTModel(cfg.model, 128).eval()
    with torch.no_grad():  # sharper attention, so a missing factor would show in the logits
        for name, p in model.named_parameters():
            if name.endswith("query_key_value.weight"):
                p.mul_(8)
    _hf_roundtrip(model, cfg, tmp_path / "hf")
    assert (tmp_path / "hf" / "logn.py").exists()
    options = json.loads((tmp_path / "hf" / "config.json").read_text())["positional_spec"]["options"]
    assert options["attention_logn_scaling"] is True and options["seq_length"] == 8


@pytest.mark.parametrize("kind", ["linear", "ntk", "yarn"])
def test_rotary_scaling_exports(tmp_path, tiny_config, kind):
    """The scaling options travel in the exported spec and run the same scheme code (logits and
    the HF kv-cache's generate())."""
    torch.manual_seed(0)
    cfg = tiny_config(pos_emb="rotary", rotary_scaling=kind, rotary_scaling_factor=4.0)
    _hf_roundtrip(GPTModel(cfg.model, 128).eval(), cfg, tmp_path / "hf")


def test_exported_files_follow_the_umask_and_autotokenizer_loads(tmp_path, tiny_config):
    """Every exported file, model.safetensors included (safetensors writes 0600), gets the usual
    0666 & ~umask; and docs/interop.md's AutoTokenizer line (trust_remote_code=True) loads the tokenizer."""
    import stat

    from megatron.interop.hf_export import export_hf
    from megatron.tokenizer import build_tokenizer

    cfg = hf_tokenizer_config(tmp_path, tiny_config)
    model = GPTModel(cfg.model, 384).eval()
    old = os.umask(0o022)
    try:
        export_hf(model, cfg, str(tmp_path / "hf"))
    finally:
        os.umask(old)
    modes = {f: stat.S_IMODE(os.stat(tmp_path / "hf" / f).st_mode) for f in os.listdir(tmp_path / "hf")}
    assert "model.safetensors" in modes and "tokenizer.json" in modes
    assert modes == dict.fromkeys(modes, 0o644)
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"), trust_remote_code=True)
    ours = build_tokenizer("HFTokenizer", str(tmp_path / "tokenizer.json"), None)
    assert hf_tok("def main(): pass")["input_ids"] == ours.tokenize("def main(): pass")


def test_xpos_export_is_finite_past_one_calls_range(tmp_path, tiny_config):
    """Issue 23: the exported xPos runs calls past max_query_span in query blocks, as ours does
    (scale base 2: 70 query positions per block in fp32, so 300 tokens overflowed in one call)."""
    from megatron.interop.hf_export import export_hf

    torch.manual_seed(0)
    cfg = tiny_config(pos_emb="xpos", xpos_scale_base=2.0)
    model = GPTModel(cfg.model, 128).eval()
    export_hf(model, cfg, str(tmp_path / "hf"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), trust_remote_code=True,
                                                           dtype=torch.float32).eval()
    tokens = torch.randint(1, 100, (1, 300))
    with torch.no_grad():
        ours, theirs = model(tokens), hf(tokens).logits
    assert bool(theirs.isfinite().all())
    torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-4)


def hf_tokenizer_config(tmp_path, tiny_config):
    """A tiny config whose tokenizer is a byte-level BPE tokenizer.json (HFTokenizer), so the export carries it."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    tok.train_from_iterator(["def main(): return 1\n"] * 20, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(tmp_path / "tokenizer.json"))
    return tiny_config(tokenizer_type="HFTokenizer", vocab_file=str(tmp_path / "tokenizer.json"), padded_vocab_size=384)


def test_exported_tokenizer_pads_batched_generate_on_the_left(tmp_path, tiny_config):
    """The usual HF recipe, tokenizer(prompts, padding=True) then generate(**batch), works on the export
    as it is: pad = the end-of-document token, padded on the left; each row continues as its prompt alone."""
    from megatron.generation import generate_tokens
    from megatron.interop.hf_export import export_hf

    cfg = hf_tokenizer_config(tmp_path, tiny_config)
    model = GPTModel(cfg.model, 384).eval()
    export_hf(model, cfg, str(tmp_path / "hf"))
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"), trust_remote_code=True)
    assert tok.pad_token == tok.eos_token == "<|endoftext|>" and tok.padding_side == "left"
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), trust_remote_code=True,
                                                           dtype=torch.float32).eval()
    prompts = ["def main(): return 1", "def"]
    batch = tok(prompts, return_tensors="pt", padding=True)
    new = 4
    got = hf.generate(**batch, max_new_tokens=new, min_new_tokens=new, do_sample=False)
    for b, text in enumerate(prompts):
        ids = tok(text)["input_ids"]
        assert got[b, batch["input_ids"].shape[1]:].tolist() == generate_tokens(model, ids, new, greedy=True), b
