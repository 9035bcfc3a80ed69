"""Issue 45 item 7: released models with scaled RoPE. Tiny random Llama and GPTNeoX models built with
transformers' config classes for each rope type the stack computes (linear, dynamic, yarn, llama3),
saved with save_pretrained, imported with tools/import_hf.py, give transformers' logits (fp32) on
sequences longer than the original length, at several lengths for the length-dependent dynamic NTK,
and through a kv-cache; exported back they are the stock class with the same rope_parameters and
logits. Every other type, and every parameter value the stack would compute differently, is refused
by name with nothing written."""
import json
import math
import os

import pytest
import torch

transformers = pytest.importorskip("transformers")

from megatron.checkpoint.load_model import load_checkpoint_model  # noqa: E402
from megatron.errors import UserError  # noqa: E402
from tests.integration.test_hf_import import import_cli, import_here  # noqa: E402

V, MAX_POS = 128, 64
LONG = (40, 80, 112)  # past original_max_position_embeddings (16) and, the last two, max_position_embeddings
TYPES = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 3.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    "yarn-betas": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 8,
                   "beta_slow": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16},
}


def hf_config(arch, rope, theta=100.0, pct=0.5):
    """A tiny model of class `arch` with rope_parameters `rope`; head_dim 16, a small base so that the
    frequencies spread over the scaled bands at these lengths."""
    common = dict(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=MAX_POS,
                  tie_word_embeddings=False, initializer_range=0.3)
    if arch == "llama":
        return transformers.LlamaConfig(**common, num_key_value_heads=2, intermediate_size=96,
                                        rope_parameters={"rope_theta": theta, **rope})
    return transformers.GPTNeoXConfig(**common, intermediate_size=128, use_parallel_residual=True,
                                      rope_parameters={"rope_theta": theta, "partial_rotary_factor": pct, **rope})


def save(tmp_path, arch, rope, name="hf", **kw):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf_config(arch, rope, **kw)).float().eval()
    path = tmp_path / name
    model.save_pretrained(path)
    return str(path)


def fresh(path):
    """transformers' model as a user loads it; fresh each time, since transformers' dynamic RoPE keeps
    the frequencies of the longest input it has seen."""
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def tokens(n, batch=2):
    return torch.randint(0, V, (batch, n), generator=torch.Generator().manual_seed(n))


def edit(path, change):
    cfg_path = os.path.join(path, "config.json")
    cfg = json.load(open(cfg_path))
    change(cfg)
    json.dump(cfg, open(cfg_path, "w"))


def logits_close(ours, theirs):
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)


@pytest.mark.parametrize("arch,kind", [("llama", k) for k in TYPES] + [("neox", "linear"), ("neox", "dynamic"),
                                                                        ("neox", "llama3")])
def test_imported_scaled_rope_gives_transformers_logits_past_the_original_length(tmp_path, arch, kind):
    src = save(tmp_path, arch, TYPES[kind])
    import_here(src, str(tmp_path / "ck"))
    ours, cfg, _ = load_checkpoint_model(str(tmp_path / "ck"))
    assert cfg.model.rotary_scaling == kind.split("-")[0]
    hf = fresh(src)
    plain = fresh(save(tmp_path, arch, {"rope_type": "default"}, name="plain"))
    for n in LONG:  # increasing: transformers' dynamic RoPE then scales at each input's own length
        t = tokens(n)
        with torch.no_grad():
            theirs, mine, unscaled = hf(t).logits, ours(t), plain(t).logits
        # perplexity of the same n-token forward (dynamic's frequencies depend on n)
        ppl_hf, ppl_ours = (torch.exp(torch.nn.functional.cross_entropy(
            x[:, :-1].flatten(0, 1), t[:, 1:].flatten())).item() for x in (theirs, mine))
        logits_close(mine, theirs)
        assert abs(ppl_ours / ppl_hf - 1) < 1e-4, (n, ppl_ours, ppl_hf)
        if kind != "dynamic" or n > MAX_POS:  # the scaling is in effect: a test that can fail
            assert (theirs - unscaled).abs().max() > 1e-2, n


def test_dynamic_ntk_through_a_kv_cache_is_transformers_generate(tmp_path):
    """transformers' dynamic NTK rotates each new token with the frequencies of the sequence so far,
    leaving cached keys as they were: ours does the same, step for step past max_position_embeddings."""
    src = save(tmp_path, "llama", TYPES["dynamic"])
    import_here(src, str(tmp_path / "ck"))
    ours, _, _ = load_checkpoint_model(str(tmp_path / "ck"))
    hf, t = fresh(src), tokens(80, batch=1)
    cache = ours.new_cache()
    with torch.no_grad():
        out = hf(t[:, :60], use_cache=True)
        logits_close(ours(t[:, :60], cache=cache), out.logits)
        past = out.past_key_values
        for i in range(60, 80):
            out = hf(t[:, i:i + 1], past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits_close(ours(t[:, i:i + 1], cache=cache), out.logits)
        # ... which is not the full-sequence forward once past the length (keys keep their step's frequencies)
        assert (ours(t)[:, -1] - out.logits[:, -1]).abs().max() > 1e-3


def test_transformers4_spelling_and_an_unread_key(tmp_path):
    """rope_scaling with `type` (transformers 4's config.json) reads as rope_parameters; a key no
    transformers function reads for that type is ignored, as transformers ignores it, and said (the
    command as a user runs it)."""
    src = save(tmp_path, "llama", TYPES["yarn"])

    def to_v4(cfg):
        rope = cfg.pop("rope_parameters")
        cfg["rope_theta"] = rope.pop("rope_theta")
        cfg["rope_scaling"] = {"type": rope.pop("rope_type"), **rope, "finetuned": True}
    edit(src, to_v4)
    proc = import_cli(src, str(tmp_path / "ck"))
    assert proc.returncode == 0, proc.stderr
    assert "rope_scaling: finetuned: transformers' yarn RoPE does not read this key" in proc.stdout
    assert "rotary-scaling yarn (factor 4, original length 16)" in proc.stdout
    ours, cfg, _ = load_checkpoint_model(str(tmp_path / "ck"))
    m = cfg.model
    assert (m.rotary_scaling, m.rotary_scaling_factor, m.rotary_scaling_original_length) == ("yarn", 4.0, 16)
    t = tokens(80)
    with torch.no_grad():
        logits_close(ours(t), fresh(src)(t).logits)


@pytest.mark.parametrize("arch,kind", [("llama", k) for k in TYPES] + [("neox", "dynamic")])
def test_import_export_round_trip_is_the_stock_class_with_the_same_rope(tmp_path, arch, kind):
    from megatron.interop.hf_export import export_hf

    src = save(tmp_path, arch, TYPES[kind])
    import_here(src, str(tmp_path / "ck"))
    ours, cfg, _ = load_checkpoint_model(str(tmp_path / "ck"))
    export_hf(ours, cfg, str(tmp_path / "out"))
    assert not [f for f in os.listdir(tmp_path / "out") if f.endswith(".py")]
    before = json.load(open(os.path.join(src, "config.json")))["rope_parameters"]
    after = json.load(open(tmp_path / "out" / "config.json"))["rope_parameters"]
    defaults = {"beta_fast": 32.0, "beta_slow": 1.0} if kind.startswith("yarn") else {}
    assert after == {**defaults, **before}, (before, after)
    for n in LONG:
        t = tokens(n)
        with torch.no_grad():
            logits_close(fresh(str(tmp_path / "out"))(t).logits, fresh(src)(t).logits)


def _import_refused(src, out, *words):
    with pytest.raises(UserError) as e:
        import_here(src, str(out))
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    assert not os.path.exists(out)


@pytest.mark.parametrize("rope,words", [
    ({"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
      "original_max_position_embeddings": 16},
     ["rope_parameters.rope_type is 'longrope'", "default, linear, dynamic, yarn, llama3"]),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "truncate": False},
     ["rope_parameters.truncate is a boolean (False)", "floors"]),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "attention_factor": 1.0},
     ["rope_parameters.attention_factor is 1.0", "0.1 ln(factor) + 1 = 1.13863"]),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "mscale": 1.0, "mscale_all_dim": 1.0},
     ["rope_parameters.mscale is 1.0 with mscale_all_dim 1.0", "attention factor is 1"]),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
     ["rope_parameters.factor is 4.0", "64 / 32 = 2", "some transformers 4 releases by that ratio"]),
    ({"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
     ["rope_parameters.low_freq_factor is missing"]),
])
def test_what_the_stack_does_not_compute_as_transformers_is_refused_by_name(tmp_path, rope, words):
    src = str(tmp_path / "hf")
    save(tmp_path, "llama", {"rope_type": "default"})
    edit(src, lambda cfg: cfg.update(rope_parameters={"rope_theta": 100.0, **rope}))
    _import_refused(src, tmp_path / "ck", *words)


@pytest.mark.parametrize("change,words", [
    (lambda c: c.update(rope_parameters=None, rope_scaling={"type": "su", "factor": 2.0}),
     ["rope_scaling.type is 'su'", "LongRoPE"]),
    (lambda c: c["rope_parameters"].update(type="linear"), ["rope_parameters.type is 'linear' but",
                                                             "rope_type is 'yarn'"]),
    (lambda c: c.update(original_max_position_embeddings=8), ["original_max_position_embeddings is 8",
                                                              "rope_parameters.original_max_position_embeddings is 16"]),
    (lambda c: c["rope_parameters"].update(factor="4"), ["rope_parameters.factor is a string"]),
    (lambda c: c["rope_parameters"].update(sliding_attention={"rope_type": "default"}),
     ["rope_parameters.sliding_attention is an object"]),
])
def test_contradictory_or_damaged_rope_entries_are_refused_by_name(tmp_path, change, words):
    src = save(tmp_path, "llama", TYPES["yarn"])
    edit(src, lambda c: (c.pop("rope_scaling", None), change(c)))
    _import_refused(src, tmp_path / "ck", *words)


def test_yarn_on_partial_rotary_is_refused_and_values_the_stack_refuses_name_config_json(tmp_path):
    src = save(tmp_path, "neox", TYPES["yarn"])
    _import_refused(src, tmp_path / "ck", "rope_parameters.rope_type is 'yarn' on 8 of 16 channels", "whole of q and k")
    src = save(tmp_path, "llama", {"rope_type": "linear", "factor": 0.5}, name="half")
    proc = import_cli(src, str(tmp_path / "ck"))  # as a user runs it: one line, the config.json key named
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "rotary-scaling-factor = 0.5 (from" in proc.stderr and "config.json's rope_parameters.factor" in proc.stderr
    assert not os.path.exists(tmp_path / "ck")


def test_matching_attention_factor_and_defaults_are_imported(tmp_path):
    """An attention_factor equal to YaRN's own, beta_fast null (transformers: the default 32) and factor
    null (transformers: max_position_embeddings / original_max_position_embeddings, 64 / 16) import."""
    rope = {**TYPES["yarn"], "factor": None, "attention_factor": 0.1 * math.log(4.0) + 1, "beta_fast": None}
    src = save(tmp_path, "llama", TYPES["yarn"])
    edit(src, lambda c: c.update(rope_parameters={"rope_theta": 100.0, **rope}))
    import_here(src, str(tmp_path / "ck"))
    ours, cfg, _ = load_checkpoint_model(str(tmp_path / "ck"))
    assert cfg.model.rotary_yarn_beta_fast == 32.0 and cfg.model.rotary_scaling_factor == 4.0
    t = tokens(80)
    with torch.no_grad():
        logits_close(ours(t), fresh(src)(t).logits)


@pytest.mark.parametrize("over,words", [
    ({"rotary_scaling": "ntk", "rotary_scaling_factor": 4.0}, "rotary-scaling ntk"),
    ({"rotary_scaling": "dynamic", "rotary_scaling_factor": 4.0, "rotary_scaling_original_length": 16},
     "rotary-scaling dynamic from rotary-scaling-original-length 16, not from max-position-embeddings 32"),
])
def test_export_refuses_what_transformers_cannot_express_by_name(tmp_path, tiny_config, over, words):
    """A Llama-shaped model whose scaling no transformers rope type computes: not the stock class
    (which would be another model), and not the remote code (NeoX's classic block only)."""
    from megatron.interop.hf_export import export_hf
    from megatron.model import GPTModel

    cfg = tiny_config(pos_emb="rotary", norm="rmsnorm", activation="swiglu", intermediate_size=96,
                      mlp_multiple_of=1, use_bias_in_norms=False, **over)
    with pytest.raises(UserError) as e:
        export_hf(GPTModel(cfg.model, 128).eval(), cfg, str(tmp_path / "out"))
    assert words in str(e.value) and "no stock transformers class" in str(e.value), str(e.value)
    assert not os.path.exists(tmp_path / "out")
