"""The NeoX family's names, both ways through one table and one layer numbering (issue 46): every
tensor of our model has a NeoX name that our_key reads back to it, and the numbering's two
directions agree."""
import pytest

from megatron.checkpoint.neox_keys import neox_key, our_key
from megatron.config import load_config
from megatron.model import layer_numbering as numbering
from megatron.model.gpt import GPTModel

TINY = {"num-layers": 3, "hidden-size": 32, "num-attention-heads": 4, "seq-length": 16,
        "max-position-embeddings": 16, "train-iters": 1, "train_micro_batch_size_per_gpu": 1}


@pytest.mark.parametrize("over", [{"pos-emb": "kerple_log"}, {"pos-emb": "alibi", "no-weight-tying": True},
                                  {"pos-emb": "rotary", "norm": "rmsnorm", "activation": "swiglu",
                                   "intermediate-size": 96}])
def test_every_tensor_round_trips_through_its_neox_name(over):
    cfg = load_config([], overrides={**TINY, **over}).model
    rms = cfg.norm == "rmsnorm"
    for key in GPTModel(cfg, 64).state_dict():
        idx, name = neox_key(key, cfg.num_layers, rms_norm=rms)
        assert our_key(idx, name, cfg.num_layers) == key, (key, idx, name)


def test_the_numbering_reads_both_ways():
    L = 5
    for idx in range(L + 5):
        kind, layer = numbering.slot(idx, L)
        if kind != numbering.FUNCTION:
            assert numbering.index(kind, L, layer) == idx
    assert [numbering.slot(i, L)[0] for i in (0, 1, 2, L + 1, L + 2, L + 3, L + 4)] == [
        "embedding", "function", "layer", "layer", "function", "final_norm", "output"]
