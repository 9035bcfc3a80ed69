"""The parameter count comes from the built model (one layer on the meta device, megatron/model/
size.py), equal to building every layer; a model no machine can hold is refused before anything is
allocated: by deepy.py naming the config file, and by GPTModel wherever a model is built."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from megatron.config import load_config
from megatron.model import GPTModel, count_parameters
from megatron.model.size import MAX_PARAMETERS, ModelTooLarge
from megatron.positional.registry import scheme_names
from tests.conftest import ROOT

parameter_count, parameter_terms = GPTModel.parameter_count, GPTModel.parameter_terms
TINY = {"num-layers": 2, "hidden-size": 32, "num-attention-heads": 4, "seq-length": 64,
        "train-iters": 3, "train_micro_batch_size_per_gpu": 2}
HUGE = {**TINY, "num-layers": 10**5, "hidden-size": 10**5, "num-attention-heads": 8}


@pytest.mark.parametrize("scheme", scheme_names())
@pytest.mark.parametrize("extra", [
    {},
    {"norm": "rmsnorm", "no-weight-tying": True, "use-bias-in-mlp": False},
    {"use-bias-in-norms": False, "use-bias-in-attn-linear": False, "intermediate-size": 100},
    {"activation": "swiglu", "num-kv-heads": 2, "gpt-j-residual": True, "gpt-j-tied": True,
     "attention-config": [[["global", "flash", "global"], "all"]]},
], ids=["default", "rmsnorm-untied", "no-bias-ffn100", "swiglu-gqa-gptj-attention-config"])
def test_count_equals_the_model_built_with_every_layer(scheme, extra):
    cfg = load_config([], overrides={**TINY, "num-layers": 3, "hidden-size": 64, "pos-emb": scheme, **extra})
    with torch.device("meta"):
        built = count_parameters(GPTModel(cfg.model, 136))
    assert parameter_count(cfg.model, 136) == built
    terms = parameter_terms(cfg.model, 136)
    assert terms["padded_vocab_size"] == 136 * 64 * (2 if extra.get("no-weight-tying") else 1)


def test_count_is_independent_of_the_depth():
    cfg = load_config([], overrides={**TINY, "num-layers": 10**5 // 2})
    started = time.perf_counter()
    n = parameter_count(cfg.model, 1000)
    assert time.perf_counter() - started < 5  # one layer is built, not 50,000
    one = parameter_count(load_config([], overrides={**TINY, "num-layers": 1}).model, 1000)
    two = parameter_count(load_config([], overrides={**TINY, "num-layers": 2}).model, 1000)
    assert n == one + (10**5 // 2 - 1) * (two - one)


def test_gpt_model_refuses_a_size_no_machine_holds_before_allocating():
    cfg = load_config([], overrides=HUGE)  # the config itself is well-formed
    started = time.perf_counter()
    with pytest.raises(ModelTooLarge) as e:
        GPTModel(cfg.model, 1000)  # on the CPU: a real allocation would take petabytes
    assert time.perf_counter() - started < 5
    # 1e5 layers * (12h^2 + 13h) + the final norm 2h, h = 1e5, plus the 1000-entry vocabulary and the
    # learned 64-position table: 1.2000013e16 + 2e5 + 1e8 + 6.4e6
    assert str(e.value).startswith("num-layers = 100000: the model would have at least 12,000,130,106,600,000 ")
    assert "PB" in str(e.value) and "1e+13" in str(e.value)


def test_largest_real_models_still_count():
    # ~1.8e12 parameters (a GPT-4-class guess) is below the limit
    cfg = load_config([], overrides={**TINY, "num-layers": 120, "hidden-size": 36864, "num-attention-heads": 96,
                                     "padded-vocab-size": 100352})
    assert parameter_count(cfg.model, 100352) < MAX_PARAMETERS


def test_deepy_refuses_it_naming_the_file_and_writes_nothing(tmp_path):
    path = tmp_path / "huge.yml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in HUGE.items()) + f"run-dir: {tmp_path / 'run'}\n")
    done = subprocess.run([sys.executable, "deepy.py", "train.py", str(path)], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "num-layers = 100000 (from " in done.stderr and "huge.yml" in done.stderr
    assert "at least 12,000,130,006,600,000 parameters" in done.stderr  # the vocabulary is not known yet: not counted
    assert sorted(p.name for p in tmp_path.iterdir()) == ["huge.yml"]


def test_loading_a_config_draws_nothing_from_the_rng():
    """A seed set before load_config gives the model it would give without the load (the old count
    built the scheme on the CPU inside load_config, shifting every seeded model after it)."""
    torch.manual_seed(0)
    state = torch.get_rng_state()
    cfg = load_config([], overrides={**TINY, "pos-emb": "kerple_log"})
    assert torch.equal(torch.get_rng_state(), state)
    GPTModel.parameter_terms(cfg.model, 64)
    assert torch.equal(torch.get_rng_state(), state)
