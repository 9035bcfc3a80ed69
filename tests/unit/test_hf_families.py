"""One file per Hugging Face family (megatron/interop/hf_families/): the registry is the only place a
stock class's name appears in the package, so adding a family is its file plus its test, and no
table or branch elsewhere (hf_config.py, hf_stock.py, hf_weights.py) names a family (issue 57)."""
import ast
from pathlib import Path

from megatron.interop.hf_families import families, family

REPO = Path(__file__).resolve().parents[2]
FAMILIES_DIR = REPO / "megatron" / "interop" / "hf_families"


def _strings(path: Path) -> str:
    """Every string literal of a module, docstrings included."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return "\n".join(n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str))


def test_the_families_are_the_stock_classes_we_read_and_write():
    assert list(families()) == ["GPTNeoXForCausalLM", "LlamaForCausalLM", "MistralForCausalLM"]
    for arch, f in families().items():
        assert family(arch) is f and f.arch == arch
        assert Path(type(f).__module__.replace(".", "/") + ".py").parent == Path("megatron/interop/hf_families")


def test_a_stock_class_is_named_only_in_its_family_file():
    names = {name for f in families().values() for name in (f.arch, f.config_class)}
    found = []
    for path in sorted((REPO / "megatron").rglob("*.py")):
        if path.parent == FAMILIES_DIR:
            continue
        text = path.read_text()
        found += [f"{path.relative_to(REPO)}: {name}" for name in sorted(names) if name in text]
    assert not found, "stock class names outside megatron/interop/hf_families/:\n" + "\n".join(found)


def test_each_family_file_names_its_own_class_only():
    for f in families().values():
        path = REPO / (type(f).__module__.replace(".", "/") + ".py")
        others = {g.arch for g in families().values() if g is not f and not isinstance(f, type(g))}
        assert f.arch in _strings(path)
        assert not any(a in _strings(path) for a in others), (path, others)


def test_one_family_claims_each_block_shape():
    from megatron.config import load_config

    base = {"num-layers": 1, "hidden-size": 32, "num-attention-heads": 4, "seq-length": 16,
            "max-position-embeddings": 16, "train-iters": 1, "train_micro_batch_size_per_gpu": 1, "pos-emb": "rotary"}
    rms = {"norm": "rmsnorm", "activation": "swiglu", "use-bias-in-norms": False, "intermediate-size": 96}
    for over, arch in (({}, "GPTNeoXForCausalLM"), (rms, "LlamaForCausalLM"),
                       ({**rms, "attention-window": 8}, "MistralForCausalLM")):
        m = load_config([], overrides={**base, **over}).model
        assert [f.arch for f in families().values() if f.claims(m)] == [arch]


def test_a_new_family_is_one_class_and_every_reader_sees_it(tiny_config):
    """What a new family file does, done here: one registered class, and hf_stock (which stock class,
    its config.json), the adapters and hf_weights (head, ignored tensors) read it with no edit."""
    from megatron.interop import hf_stock
    from megatron.interop.hf_families import registry
    from megatron.interop.hf_families.llama import Llama

    class Throwaway(Llama):  # a Llama whose config.json says another class (as Qwen2 would)
        arch, name, config_class, model_type = "ThrowawayForCausalLM", "Throwaway", "ThrowawayConfig", "throwaway"

        def claims(self, m) -> bool:
            return m.norm != "layernorm" and m.attention_window is None and m.num_layers == 3

    claimants = {a: f.claims for a, f in families().items()}
    try:
        registry.register_family(Throwaway)
        registry._FAMILIES["LlamaForCausalLM"].claims = lambda m: claimants["LlamaForCausalLM"](m) and m.num_layers != 3
        m = tiny_config(num_layers=3, norm="rmsnorm", activation="swiglu", use_bias_in_norms=False, use_bias_in_attn_linear=False,
                        use_bias_in_mlp=False, intermediate_size=96, pos_emb="rotary").model
        assert hf_stock.stock_class(m) == ("ThrowawayForCausalLM", "")
        cfg_json = hf_stock.stock_config("ThrowawayForCausalLM", m, 64, "float32")
        assert cfg_json["architectures"] == ["ThrowawayForCausalLM"] and cfg_json["model_type"] == "throwaway"
        assert family("ThrowawayForCausalLM").head == "lm_head.weight"
    finally:
        registry._FAMILIES.pop("ThrowawayForCausalLM", None)
        del registry._FAMILIES["LlamaForCausalLM"].claims  # the class's own method again
    assert "ThrowawayForCausalLM" not in families()
