"""NeoX's block shapes as options of the one block (docs/architecture.md): parallel residual
(gpt-j-residual, gpt-j-tied), NeoX's activations (gated ones sized by NeoX's rule), tanh / erf
GELU, grouped-query attention. Each against an independent computation of what NeoX does, and
every option with every positional scheme on every attention backend (forward and backward
against the reference backend; the Triton kernel in its interpreter on CPU), and with the kv-cache."""
import math

import pytest
import torch
import torch.nn.functional as F

from megatron.attention import backend_names, resolve_backend
from megatron.config import ConfigError, load_config
from megatron.model import GPTModel
from megatron.model.transformer import erf_gelu, tanh_gelu
from megatron.positional.registry import scheme_names
from tests.conftest import TINY_MODEL, write_yaml

# Each a NeoX family's block: Pythia / NeoX-20B, Pythia with tied norms, Llama-2 70B style
# (SwiGLU, GQA, RMSNorm, no biases), and multi-query attention with GEGLU.
ARCHS = {
    "pythia": {"gpt-j-residual": True, "bias-gelu-fusion": True},
    "gptj-tied": {"gpt-j-residual": True, "gpt-j-tied": True, "onnx-safe": True},
    "llama": {"activation": "swiglu", "mlp-multiple-of": 8, "num-kv-heads": 2, "norm": "rmsnorm",
              "use-bias-in-attn-linear": False, "use-bias-in-mlp": False, "use-bias-in-norms": False},
    "mqa-geglu": {"activation": "geglu", "num-kv-heads": 1, "intermediate-size": 96},
}
L = 12


def model_of(tmp_path, pos, backend="reference", seed=0, **over):
    path = write_yaml(tmp_path / "m.yml", {**TINY_MODEL, "num-layers": 1, "pos-emb": pos,
                                            "attention-backend": backend, **over})
    torch.manual_seed(seed)
    return GPTModel(load_config([path]).model, 128)


def grads_of(model, tokens):
    model.zero_grad(set_to_none=True)
    logits = model(tokens)
    model(tokens, labels=tokens).backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def backends_for(pos: str, arch: dict, tmp_path, training: bool = True) -> list[str]:
    """The non-reference backends that accept this scheme on the CPU (for training, or inference)."""
    scheme = model_of(tmp_path, pos, **arch).position
    out = []
    for name in backend_names():
        try:
            resolve_backend(name, scheme, torch.device("cpu"), torch.float32, training)
        except ValueError:
            continue
        if name != "reference":
            out.append(name)
    return out


# Every scheme on the two archs that between them hold every option reaching the attention (GQA,
# parallel residual); the other two (tied norms, MQA + GEGLU) on one scheme of each kind, to keep
# the suite's time (the Triton interpreter costs ~1 s a case).
CASES = [(a, p) for a in ("llama", "pythia") for p in scheme_names()] + \
    [(a, p) for a in ("gptj-tied", "mqa-geglu") for p in ("kerple_log", "alibi", "rotary", "rpe")]


@pytest.mark.parametrize("arch,pos", CASES)
def test_every_option_with_every_scheme_and_backend(tmp_path, arch, pos):
    over = ARCHS[arch]
    tokens = torch.randint(0, 128, (2, L))
    ref_logits, ref_grads = grads_of(model_of(tmp_path, pos, **over), tokens)
    assert torch.isfinite(ref_logits).all()
    backends = backends_for(pos, over, tmp_path)
    assert backends  # every scheme trains on some backend besides the reference
    for backend in backends:
        logits, grads = grads_of(model_of(tmp_path, pos, backend, **over), tokens)
        torch.testing.assert_close(logits, ref_logits, rtol=2e-4, atol=2e-4, msg=f"{backend} logits")
        assert set(grads) == set(ref_grads), backend
        for name, g in grads.items():
            torch.testing.assert_close(g, ref_grads[name], rtol=2e-3, atol=2e-4, msg=f"{backend} {name}")
    # Backends that only run inference on the CPU (flex: no CPU backward) are checked forward, on
    # two schemes and the two archs (a compile each costs seconds; the scheme reaches flex through
    # its score_mod, which tests/unit/test_flex_backend.py checks for every scheme).
    inference_only = set(backends_for(pos, over, tmp_path, training=False)) - set(backends)
    for backend in inference_only if pos in ("kerple_log", "alibi") and arch in ("llama", "pythia") else ():
        with torch.no_grad():
            logits = model_of(tmp_path, pos, backend, **over).eval()(tokens)
            reference = model_of(tmp_path, pos, **over).eval()(tokens)
        torch.testing.assert_close(logits, reference, rtol=2e-4, atol=2e-4, msg=f"{backend} inference")


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("pos", ["kerple_log", "rotary", "alibi", "xpos"])
def test_kv_cache_decoding_equals_the_full_forward(tmp_path, arch, pos):
    model = model_of(tmp_path, pos, **ARCHS[arch]).eval()
    tokens = torch.randint(0, 128, (2, L))
    with torch.no_grad():
        full = model(tokens)
        cache, steps = model.new_cache(), []
        for start, n in ((0, 5), *((i, 1) for i in range(5, L))):
            steps.append(model(tokens[:, start:start + n], cache=cache))
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)
    if ARCHS[arch].get("num-kv-heads"):  # the cache holds the key/value heads only
        assert cache.kv[0][0].shape[1] == ARCHS[arch]["num-kv-heads"]


@pytest.mark.parametrize("tied", [False, True])
def test_parallel_residual_is_neox_s_formula(tmp_path, tied):
    """x + attn(ln1(x)) + mlp(ln2(x)), and with gpt-j-tied ln1 for both branches."""
    model = model_of(tmp_path, "kerple_log", **{"gpt-j-residual": True, "gpt-j-tied": tied})
    layer = model.layers[0]
    seen = {}
    layer.register_forward_pre_hook(lambda mod, args: seen.update(x=args[0].detach()))
    layer.register_forward_hook(lambda mod, args, out: seen.update(out=out.detach()))
    layer.attention.register_forward_hook(lambda mod, args, out: seen.update(attn_x=args[0], attn=out.detach()))
    with torch.no_grad():
        model(torch.randint(0, 128, (2, L)))
        x = seen["x"]
        ln1 = layer.input_layernorm(x)
        expected = x + seen["attn"] + layer.mlp(ln1 if tied else layer.post_attention_layernorm(x))
    torch.testing.assert_close(seen["attn_x"], ln1)
    torch.testing.assert_close(seen["out"], expected, rtol=1e-6, atol=1e-6)


def test_sequential_and_parallel_residual_differ(tmp_path):
    """Removing gpt-j-residual from a Pythia config must not give the same model (the silent
    conversion the issue found): same weights, other function."""
    tokens = torch.randint(0, 128, (2, L))
    seq = model_of(tmp_path, "rotary", seed=3)
    par = model_of(tmp_path, "rotary", seed=3, **{"gpt-j-residual": True})
    par.load_state_dict(seq.state_dict())
    with torch.no_grad():
        assert (seq(tokens) - par(tokens)).abs().max() > 1e-3


def test_gated_mlp_is_act_of_the_gate_times_the_other_half(tmp_path):
    for act, fn in (("swiglu", lambda g: g * torch.sigmoid(g)), ("geglu", F.gelu), ("reglu", F.relu),
                    ("glu", torch.sigmoid), ("bilinear", lambda g: g)):
        mlp = model_of(tmp_path, "none", activation=act, **{"intermediate-size": 96}).layers[0].mlp
        x = torch.randn(3, 32)
        w1, b1 = mlp.dense_h_to_4h.weight, mlp.dense_h_to_4h.bias
        half = w1.shape[0] // 2
        up, gate = x @ w1[:half].T + b1[:half], x @ w1[half:].T + b1[half:]
        expected = (fn(gate) * up) @ mlp.dense_4h_to_h.weight.T + mlp.dense_4h_to_h.bias
        torch.testing.assert_close(mlp(x), expected, rtol=1e-5, atol=1e-6, msg=act)


def test_gelu_variants_are_neox_s():
    x = torch.linspace(-6, 6, 1001, dtype=torch.float64)
    torch.testing.assert_close(tanh_gelu(x), F.gelu(x, approximate="tanh"), rtol=0, atol=1e-8)
    assert (tanh_gelu(x) - F.gelu(x)).abs().max() > 1e-4  # NOT the exact GELU: Pythia's differs
    torch.testing.assert_close(erf_gelu(x), x * 0.5 * (torch.erf(x / 1.41421) + 1))


@pytest.mark.parametrize("hidden,size,multiple,act,expected", [
    (4096, 32768, 256, "swiglu", (22016, 11008)),  # Llama 7B: HF intermediate_size 11008
    (5120, 40960, 256, "swiglu", (27648, 13824)),  # Llama 13B: 13824
    (8192, 86016, 256, "swiglu", (57344, 28672)),  # Llama 2 70B: 28672
    (4096, 43008, 256, "swiglu", (28672, 14336)),  # Mistral 7B with 3 * 14336: 14336
    (768, None, 1, "gelu", (3072, 3072)),  # Pythia 160M: 4h
    (32, 100, 1, "geglu", (66, 33)),
])
def test_mlp_widths_follow_neox_s_rule(tmp_path, hidden, size, multiple, act, expected):
    from megatron.config.model import ModelConfig

    cfg = ModelConfig(num_layers=1, hidden_size=hidden, num_attention_heads=32 if hidden > 64 else 4, seq_length=8,
                      intermediate_size=size, mlp_multiple_of=multiple, activation=act)
    assert cfg.mlp_widths == expected and not cfg.check()


def test_grouped_query_equals_multi_head_with_repeated_kv_heads(tmp_path):
    """GQA's [Q | K | V] projection equals an MHA model whose per-head [q_h | k_h | v_h] rows repeat
    each key/value head for its group (query head i reads kv head i // (H / H_kv))."""
    gqa = model_of(tmp_path, "kerple_log", seed=1, **{"num-kv-heads": 2})
    mha = model_of(tmp_path, "kerple_log", seed=2)
    H, G, D = 4, 2, 8
    state = dict(gqa.state_dict())
    for key in [k for k in state if k.endswith("query_key_value.weight") or k.endswith("query_key_value.bias")]:
        t = state[key]
        q, k, v = t.split([H * D, G * D, G * D])
        q, k, v = q.unflatten(0, (H, D)), k.unflatten(0, (G, D)), v.unflatten(0, (G, D))
        k, v = k.repeat_interleave(H // G, 0), v.repeat_interleave(H // G, 0)
        state[key] = torch.cat([q, k, v], dim=1).flatten(0, 1)  # per head: [q_h | k_h | v_h]
    mha.load_state_dict(state)
    tokens = torch.randint(0, 128, (2, L))
    with torch.no_grad():
        torch.testing.assert_close(gqa(tokens), mha(tokens), rtol=1e-5, atol=1e-5)
    assert gqa.layers[0].attention.query_key_value.weight.shape[0] == (H + 2 * G) * D


@pytest.mark.parametrize("over,message", [
    ({"num-kv-heads": 3}, "must divide num-attention-heads"),
    ({"gpt-j-tied": True}, "only applies with gpt-j-residual"),
    ({"onnx-safe": True, "bias-gelu-fusion": True}, "cannot be combined with bias-gelu-fusion"),
    ({"intermediate-size": 100, "expansion-factor": 2.0}, "NeoX takes one of them"),
    ({"activation": "swiglu", "intermediate-size": 14336}, "NeoX would build mismatched layers"),
    ({"sliding-window-width": 7, "attention-window": 4}, "give one of the two"),
    ({"attention-config": [[["local"], 2]]}, "block-sparse sliding window"),
    ({"attention-config": [[["flash"], 3]]}, "gives 3 layer types for num-layers 2"),
    ({"attention-config": [[["mamba"], "all"]]}, "Mamba blocks"),
    ({"te-mha": True, "te-fp8-format": "hybrid"}, "Transformer Engine"),
    ({"moe-num-experts": 8}, "mixture-of-experts"),
    ({"use_bnb_optimizer": True}, "bitsandbytes"),
])
def test_what_neox_refuses_or_we_lack_is_named(tmp_path, over, message):
    path = write_yaml(tmp_path / "bad.yml", {**TINY_MODEL, **over})
    with pytest.raises(ConfigError) as e:
        load_config([path])
    assert message in str(e.value)
    assert "unknown key" not in str(e.value)  # named by its feature, not a generic list


def test_neox_defaults_of_foreign_features_are_accepted(tmp_path):
    path = write_yaml(tmp_path / "ok.yml", {**TINY_MODEL, "moe-num-experts": 1, "te-mha": False,
                                             "use_bnb_optimizer": False, "attention-config": [[["flash"], 2]]})
    assert load_config([path]).model.num_layers == 2


def test_sliding_window_width_is_neox_s_w_plus_one_keys(tmp_path):
    """flash-attn's window_size (W, -1) as NeoX passes it: keys i - W .. i, W + 1 of them."""
    path = write_yaml(tmp_path / "m.yml", {**TINY_MODEL, "sliding-window-width": 4})
    cfg = load_config([path])
    assert cfg.model.attention_window == 5
    assert load_config([cfg.save(tmp_path / "r.yml") or tmp_path / "r.yml"]).model.attention_window == 5


def test_expansion_factor_folds_into_intermediate_size(tmp_path):
    path = write_yaml(tmp_path / "m.yml", {**TINY_MODEL, "expansion-factor": 2.5})
    cfg = load_config([path]).model
    assert (cfg.intermediate_size, cfg.expansion_factor) == (80, None) and cfg.mlp_widths == (80, 80)
    assert math.isclose(2.5 * 32, cfg.intermediate_size)


def test_export_refuses_a_block_the_remote_code_lacks(tmp_path):
    from megatron.errors import UserError
    from megatron.interop.hf_export import _check_supported

    for over in ARCHS.values():
        path = write_yaml(tmp_path / "m.yml", {**TINY_MODEL, **over})
        with pytest.raises(UserError, match="cannot be exported to Hugging Face yet"):
            _check_supported(load_config([path]).model)
