"""Each Hugging Face family's adapter is one name map read both ways: to_hf then from_hf gives our
state back bit for bit, every foreign tensor comes from exactly one of ours, and a tensor the stock
class has no place for is refused, not dropped (issue 46)."""
import pytest
import torch

from megatron.config import load_config
from megatron.errors import UserError
from megatron.interop.hf_families import adapter
from megatron.model.gpt import GPTModel

TINY = {"num-layers": 2, "hidden-size": 32, "num-attention-heads": 4, "seq-length": 16,
        "max-position-embeddings": 16, "train-iters": 1, "train_micro_batch_size_per_gpu": 1, "pos-emb": "rotary"}
LLAMA = {"norm": "rmsnorm", "activation": "swiglu", "use-bias-in-norms": False, "use-bias-in-attn-linear": False,
         "use-bias-in-mlp": False, "no-weight-tying": True, "intermediate-size": 96}


@pytest.mark.parametrize("arch,over", [
    ("GPTNeoXForCausalLM", {}),
    ("GPTNeoXForCausalLM", {"gpt-j-residual": True, "no-weight-tying": True}),
    ("LlamaForCausalLM", LLAMA),
    ("LlamaForCausalLM", {**LLAMA, "num-kv-heads": 2}),
    ("MistralForCausalLM", {**LLAMA, "num-kv-heads": 1, "attention-window": 8}),
])
def test_round_trip_is_exact(arch, over):
    cfg = load_config([], overrides={**TINY, **over}).model
    torch.manual_seed(0)
    state = {k: v for k, v in GPTModel(cfg, 64).state_dict().items() if not k.startswith("position.")}
    a = adapter(arch, cfg)
    theirs = a.to_hf(state)
    back = a.from_hf(theirs)
    assert back.keys() == state.keys()
    assert all(torch.equal(back[k], state[k]) for k in state)
    assert len(theirs) >= len(state)  # the QKV and gated MLP become several tensors, nothing merges


def test_a_tensor_without_a_place_is_refused_not_dropped():
    cfg = load_config([], overrides=TINY).model
    state = GPTModel(cfg, 64).state_dict()
    with pytest.raises(UserError, match="no place for the model's tensors .*layers.0.extra"):
        adapter("GPTNeoXForCausalLM", cfg).to_hf({**state, "layers.0.extra.weight": torch.zeros(1)})
