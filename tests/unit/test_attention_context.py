"""One AttentionContext per model forward: the shared scheme's bias (and SDPA's float mask) is
built once for every layer, with the same logits and gradients as one per layer."""
import pytest
import torch

import megatron.attention.sdpa as sdpa
import megatron.attention.triton as triton_backend
import megatron.model.attention as attention_mod
from megatron.attention.mask import check_window, consecutive_starts
from megatron.model import GPTModel
from megatron.model.gpt import masked_mean


def count_bias_calls(model, monkeypatch) -> list:
    """Calls that build a bias: the scheme's dense score_bias, or SDPA's CPU inference mask."""
    calls = []

    def counting(original):
        return lambda *args: calls.append(1) or original(*args)

    monkeypatch.setattr(model.position, "score_bias", counting(model.position.score_bias))
    monkeypatch.setattr(sdpa, "diagonal_mask", counting(sdpa.diagonal_mask))
    return calls


@pytest.mark.parametrize("backend", ["sdpa", "reference"])
@pytest.mark.parametrize("pos", ["kerple_log", "alibi"])
def test_eval_forward_builds_the_bias_once_per_forward(tiny_config, monkeypatch, backend, pos):
    model = GPTModel(tiny_config(pos_emb=pos, num_layers=3, attention_backend=backend).model, 128).eval()
    calls = count_bias_calls(model, monkeypatch)
    with torch.no_grad():
        model(torch.randint(0, 128, (1, 16)))
    assert len(calls) == 1


def test_training_a_learnable_bias_keeps_one_per_layer(tiny_config, monkeypatch):
    """Bit-identical training gradients (see shares_prepared): one bias per layer there."""
    model = GPTModel(tiny_config(pos_emb="kerple_log", num_layers=3, attention_backend="sdpa").model, 128)
    calls = count_bias_calls(model, monkeypatch)
    tokens = torch.randint(0, 128, (1, 16))
    model(tokens, labels=tokens).backward()
    assert len(calls) == 3


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("backend", ["sdpa", "reference"])
def test_a_shared_bias_gives_the_per_layer_gradients(tiny_config, monkeypatch, backend, checkpointing):
    """Forced sharing while training: the same loss bit for bit and the gradients up to rounding
    (the layers' bias gradients are summed before the reduction to the parameters), also through
    activation checkpointing (the context is built outside the checkpointed layers)."""
    cfg = tiny_config(pos_emb="kerple_log", num_layers=3, attention_backend=backend).model
    tokens = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    results = []
    for share in (False, True):
        monkeypatch.setattr(attention_mod, "shares_prepared", lambda scheme, backend, share=share: share)
        torch.manual_seed(0)
        model = GPTModel(cfg, 128, checkpoint_activations=checkpointing)
        calls = count_bias_calls(model, monkeypatch)
        loss = model(tokens, labels=tokens.roll(-1, 1))
        loss.backward()
        # checkpointing recomputes each layer in backward: 3 more per-layer builds, none when shared
        assert len(calls) == (1 if share else 3 * (2 if checkpointing else 1))
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert torch.equal(loss_a, loss_b)
    assert grads_b["position.bias_p"].abs().sum() > 0
    for name, g in grads_a.items():
        torch.testing.assert_close(grads_b[name], g, rtol=0, atol=1e-6, msg=name)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_training_kerple_on_triton_checks_positions_once_per_forward(tiny_config, monkeypatch, checkpointing):
    """The triton backend's prepared state is two ints (q0, k0), not a bias on the parameters'
    graph: training KERPLE shares it too. Each check is a host sync (consecutive_starts): one per
    layer, and again in every recomputed layer, stalled the GPU 24 times per 162M step (12 layers,
    activation checkpointing) where ALiBi stalled once."""
    cfg = tiny_config(pos_emb="kerple_log", num_layers=3, attention_backend="triton").model
    model = GPTModel(cfg, 128, checkpoint_activations=checkpointing)
    calls = []
    real = triton_backend.consecutive_starts
    monkeypatch.setattr(triton_backend, "consecutive_starts", lambda q, k: calls.append(1) or real(q, k))
    tokens = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    model(tokens, labels=tokens.roll(-1, 1)).backward()
    assert len(calls) == 1
    assert model.position.bias_p.grad.abs().sum() > 0


def test_consecutive_starts():
    ar = torch.arange
    assert consecutive_starts(ar(4), ar(4)) == (0, 0)
    assert consecutive_starts(ar(2) + 5, ar(7)) == (5, 0)  # kv-cache rows
    assert consecutive_starts(ar(1) + 3, ar(4)) == (3, 0)  # one new token
    assert consecutive_starts(torch.tensor([0, 2, 3]), ar(4)) is None
    assert consecutive_starts(ar(3), torch.tensor([0, 1, 1])) is None
    assert consecutive_starts(ar(0), ar(3)) is None


@pytest.mark.parametrize("window", [0, -1, 2.5, True, "8"])
def test_check_window_refuses_non_positive_integers(window):
    with pytest.raises(ValueError, match="attention window must be an integer >= 1"):
        check_window(window)
    check_window(None)
    check_window(1)


def test_pipeline_loss_is_the_model_loss(tiny_config):
    """Both model forms use masked_mean (megatron/model/gpt.py): the pipeline's loss_fn on the logits equals
    GPTModel's loss (its chunked CE path) bit for bit."""
    from megatron.parallel.pipeline import loss_fn

    torch.manual_seed(0)
    model = GPTModel(tiny_config().model, 128)
    tokens, labels = torch.randint(0, 128, (2, 16)), torch.randint(0, 128, (2, 16))
    mask = torch.ones(2, 16)
    mask[0, :5] = 0
    assert torch.equal(loss_fn(model(tokens), (labels, mask)), model(tokens, labels=labels, loss_mask=mask))
    assert torch.equal(masked_mean(torch.tensor([1.0, 3.0]), torch.tensor([0, 1])), torch.tensor(3.0))


def _flex_can_compile_on_cpu() -> bool:
    from megatron.attention.flex import _cpp_compiler

    return _cpp_compiler() is not None


needs_compiler = pytest.mark.skipif(not _flex_can_compile_on_cpu(), reason="no C++ compiler for compiled flex")


@needs_compiler
def test_auto_takes_compiled_flex_for_long_cpu_inference_only_where_sdpa_cannot():
    """Score-weight schemes (SDPA refuses them): flex over long sequences, the reference below.
    Schemes SDPA runs: SDPA at every length (its CPU inference route beats compiled flex)."""
    from megatron.attention.resolve import CPU_FLEX_MIN_TOKENS, resolve_backend
    from megatron.positional.base import PositionalSpec
    from megatron.positional.registry import build_scheme

    spec = PositionalSpec(num_heads=2, head_dim=8, hidden_size=16, max_position_embeddings=16)
    weighted, kerple, plain = (build_scheme(n, spec) for n in ("kerple_power_ap_ap", "kerple_log", "none"))
    long, short = CPU_FLEX_MIN_TOKENS, CPU_FLEX_MIN_TOKENS - 1

    def pick(scheme, training=False, tokens=long, name="auto"):
        return resolve_backend(name, scheme, "cpu", torch.float32, training, tokens=tokens).name

    assert pick(weighted) == "flex"
    assert pick(weighted, tokens=short) == pick(weighted, tokens=None) == "reference"
    assert pick(weighted, training=True) == "reference"  # flex has no CPU backward
    assert pick(kerple) == pick(kerple, tokens=16384) == pick(kerple, tokens=short) == "sdpa"
    assert pick(plain) == "sdpa"  # no bias: SDPA's causal path
    assert pick(kerple, name="flex") == "flex"  # an explicit name is kept


@needs_compiler
def test_the_model_tells_auto_its_length_only_for_a_full_sequence(tiny_config, monkeypatch):
    import megatron.attention.resolve as resolve

    monkeypatch.setattr(resolve, "CPU_FLEX_MIN_TOKENS", 16)
    model = GPTModel(tiny_config(pos_emb="kerple_power_ap_ap").model, 128).eval()
    x = torch.zeros(1, 16, 32)

    def build(*positions):  # each with a fresh backend cache
        return attention_mod.AttentionContext.build(model.model_cfg, model.position, {}, x.device, x.dtype, False,
                                                    *positions)

    with torch.no_grad():
        full = build(torch.arange(16))
        short = build(torch.arange(8))
        gapped = build(torch.arange(16) * 2)
        cached = build(torch.tensor([15]), torch.arange(16))
    assert full.backend.name == "flex"
    assert short.backend.name == gapped.backend.name == cached.backend.name == "reference"


@pytest.mark.parametrize("pos", ["kerple_log", "alibi"])
def test_a_training_step_on_triton_never_syncs_with_the_host(tiny_config, monkeypatch, pos):
    """Every host read of a tensor's value (item, tolist, bool, int, float) from our code during a
    training forward + backward with activation checkpointing: on a GPU each one waits for the
    queued kernels, after which the host must refill the queue. None is needed: the positions'
    layout check (consecutive_starts) answers on the host for the model's own positions (one read
    per step before); training KERPLE made 2 per layer (its forward and its recomputation) before
    its prepared state was shared: 6 here, 24 in a 162M step."""
    import os
    import traceback

    cfg = tiny_config(pos_emb=pos, num_layers=3, attention_backend="triton").model
    model = GPTModel(cfg, 128, checkpoint_activations=True)
    tokens = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    ours = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "megatron")
    reads = []

    def counting(name):
        original = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            caller = traceback.extract_stack(limit=2)[0]
            if caller.filename.startswith(ours):
                reads.append(f"{os.path.relpath(caller.filename, ours)}:{caller.lineno} {name}")
            return original(self, *args, **kwargs)
        return read

    for name in ("item", "tolist", "__bool__", "__int__", "__float__"):
        monkeypatch.setattr(torch.Tensor, name, counting(name))
    model(tokens, labels=tokens.roll(-1, 1)).backward()
    assert reads == []
    # the counting itself works: positions not made by the model are checked on the device
    from megatron.attention.mask import consecutive_starts

    assert consecutive_starts(torch.arange(3), torch.arange(3)) == (0, 0) and len(reads) == 1
