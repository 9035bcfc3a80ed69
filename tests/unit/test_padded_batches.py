"""Padded batches: sequences of different lengths in one batch, padded on the right (scoring) or
on the left (generation, `row_starts`), give each real token the log-probabilities it gets when
its sequence is scored alone, for every registered scheme, on every backend that runs on CPU,
with log-n scaling, with a window, and through kv-cache decoding."""
import pytest
import torch

from megatron.attention.mask import allowed_mask, row_positions, row_starts_from_attention_mask
from megatron.model import GPTModel
from megatron.positional.registry import scheme_names
from tests.conftest import KERNEL_DEVICE

VOCAB, PAD = 128, 0
LENGTHS = [11, 4, 8]  # a longest row, a short one, one in between
TOL = 1e-5


def _model(tiny_config, **over):
    torch.manual_seed(0)
    return GPTModel(tiny_config(**over).model, VOCAB).eval()


def _sequences(seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (n,), generator=g) for n in LENGTHS]


def _alone(model, seqs):
    """Per-token log-probabilities (n, V) of each sequence scored by itself."""
    with torch.no_grad():
        return [torch.log_softmax(model(s[None]).float(), -1)[0] for s in seqs]


def _left_padded(seqs):
    L = max(len(s) for s in seqs)
    tokens = torch.full((len(seqs), L), PAD, dtype=torch.long)
    for b, s in enumerate(seqs):
        tokens[b, L - len(s):] = s
    return tokens, torch.tensor([L - len(s) for s in seqs])


def _right_padded(seqs):
    L = max(len(s) for s in seqs)
    tokens = torch.full((len(seqs), L), PAD, dtype=torch.long)
    for b, s in enumerate(seqs):
        tokens[b, :len(s)] = s
    return tokens


def _check(got_rows, want):
    for got, ref in zip(got_rows, want):
        torch.testing.assert_close(got, ref, rtol=TOL, atol=TOL)


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
@pytest.mark.parametrize("pos", scheme_names())
def test_padded_batch_equals_each_sequence_alone(tiny_config, pos, backend):
    model = _model(tiny_config, pos_emb=pos, attention_backend=backend)
    if backend == "sdpa" and model.position.has_score_weight:
        pytest.skip("SDPA cannot multiply scores (the resolver refuses it)")
    seqs = _sequences()
    want = _alone(model, seqs)
    with torch.no_grad():
        right = torch.log_softmax(model(_right_padded(seqs)).float(), -1)
        tokens, starts = _left_padded(seqs)
        left = torch.log_softmax(model(tokens, row_starts=starts).float(), -1)
    _check([right[b, :len(s)] for b, s in enumerate(seqs)], want)
    _check([left[b, len(left[b]) - len(s):] for b, s in enumerate(seqs)], want)
    assert torch.isfinite(left).all()  # padding rows attend to themselves: finite, never NaN


@pytest.mark.parametrize("pos", ["kerple_log", "fire", "learned", "rotary"])
@pytest.mark.parametrize("over", [{"attention_window": 3}, {"attention_logn_scaling": True, "seq_length": 4,
                                                           "attention_logn_everywhere": True}])
def test_left_padding_with_window_and_logn(tiny_config, pos, over):
    model = _model(tiny_config, pos_emb=pos, **over)
    seqs = _sequences(2)
    want = _alone(model, seqs)
    tokens, starts = _left_padded(seqs)
    with torch.no_grad():
        left = torch.log_softmax(model(tokens, row_starts=starts).float(), -1)
    _check([left[b, tokens.shape[1] - len(s):] for b, s in enumerate(seqs)], want)


@pytest.mark.parametrize("pos", scheme_names())
def test_left_padded_generation_with_kv_cache(tiny_config, pos):
    """Left-padded prompts, then one token per step through the cache: every row's logits equal
    its own unpadded full-sequence logits."""
    model = _model(tiny_config, pos_emb=pos)
    prompts = _sequences(3)
    cont = torch.randint(1, VOCAB, (len(prompts), 4), generator=torch.Generator().manual_seed(4))
    tokens, starts = _left_padded(prompts)
    with torch.no_grad():
        cache = model.new_cache()
        steps = [model(tokens, cache=cache, row_starts=starts)[:, -1:]]
        for t in range(cont.shape[1] - 1):
            steps.append(model(cont[:, t:t + 1], cache=cache))
        got = torch.cat(steps, dim=1)  # logits predicting cont[:, 0..3]
        for b, p in enumerate(prompts):
            full = model(torch.cat([p, cont[b, :-1]])[None])[0, len(p) - 1:]
            torch.testing.assert_close(got[b], full, rtol=TOL, atol=TOL)


def test_flex_takes_padding_on_cpu(tiny_config):
    """Compiled flex (CPU inference) with the padded block mask equals the reference."""
    pytest.importorskip("torch._inductor")
    from megatron.attention.flex import FlexAttention

    if FlexAttention().unsupported_reason(_model(tiny_config).position, torch.device("cpu"), torch.float32,
                                          training=False) is not None:
        pytest.skip("no C++ compiler for compiled flex on CPU")
    ref = _model(tiny_config, pos_emb="kerple_log", attention_backend="reference")
    flex = _model(tiny_config, pos_emb="kerple_log", attention_backend="flex")
    tokens, starts = _left_padded(_sequences())
    with torch.no_grad():
        torch.testing.assert_close(flex(tokens, row_starts=starts), ref(tokens, row_starts=starts),
                                   rtol=TOL, atol=TOL)


def test_all_zero_row_starts_is_the_unpadded_path(tiny_config):
    model = _model(tiny_config, pos_emb="kerple_log")
    tokens = torch.randint(1, VOCAB, (2, 7))
    with torch.no_grad():
        assert torch.equal(model(tokens, row_starts=torch.zeros(2, dtype=torch.long)), model(tokens))


def test_padding_mask_rule():
    q = k = torch.arange(5)
    allowed = allowed_mask(q, k, None, torch.tensor([0, 3]))
    assert allowed.shape == (2, 1, 5, 5)
    assert torch.equal(allowed[0, 0], allowed_mask(q, k))
    # row 1: positions 0..2 are padding, each sees only itself; real queries see keys 3..i
    assert allowed[1, 0].int().tolist() == [[1, 0, 0, 0, 0], [0, 1, 0, 0, 0], [0, 0, 1, 0, 0],
                                            [0, 0, 0, 1, 0], [0, 0, 0, 1, 1]]
    assert row_positions(q, torch.tensor([0, 3])).tolist() == [[0, 1, 2, 3, 4], [0, 0, 0, 0, 1]]


def test_attention_mask_to_row_starts():
    m = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0]])
    assert row_starts_from_attention_mask(m).tolist() == [2, 0, 0]
    assert row_starts_from_attention_mask(torch.tensor([[1, 1, 0]])) is None  # right padding only
    with pytest.raises(ValueError, match="contiguous"):
        row_starts_from_attention_mask(torch.tensor([[1, 0, 1]]))


def test_bad_row_starts_are_clear_errors(tiny_config):
    model = _model(tiny_config)
    tokens = torch.randint(1, VOCAB, (2, 5))
    with pytest.raises(ValueError, match=r"\(2,\) integer tensor"):
        model(tokens, row_starts=torch.tensor([1]))
    with pytest.raises(ValueError, match=">= 0"):
        model(tokens, row_starts=torch.tensor([1, -1]))


def test_flash_is_never_given_a_padded_batch():
    from megatron.attention.resolve import resolve_backend
    from megatron.positional.base import PositionalSpec
    from megatron.positional.registry import build_scheme

    scheme = build_scheme("alibi", PositionalSpec(num_heads=2, head_dim=8, hidden_size=16, max_position_embeddings=16))
    with pytest.raises(ValueError, match="padded"):
        resolve_backend("flash", scheme, "cpu", torch.float32, False, padded=True)
    assert resolve_backend("auto", scheme, "cpu", torch.float32, False, padded=True).name != "flash"


@pytest.mark.gpu
@pytest.mark.parametrize("pos", ["kerple_log", "rpe"])
def test_triton_kernel_takes_padded_batches(tiny_config, pos):
    """The fused kernel (compiled on a GPU, Triton's interpreter on CPU): a left-padded batch and
    left-padded kv-cache decoding give each row what it gets alone."""
    pytest.importorskip("triton")
    model = _model(tiny_config, pos_emb=pos, attention_backend="triton").to(KERNEL_DEVICE)
    seqs = [s.to(KERNEL_DEVICE) for s in _sequences(5)]
    want = _alone(model, seqs)
    tokens, starts = (x.to(KERNEL_DEVICE) for x in _left_padded(seqs))
    with torch.no_grad():
        left = torch.log_softmax(model(tokens, row_starts=starts).float(), -1)
        cache = model.new_cache()
        first = model(tokens[:, :-2], cache=cache, row_starts=starts)
        rest = torch.cat([first, model(tokens[:, -2:-1], cache=cache), model(tokens[:, -1:], cache=cache)], dim=1)
    _check([left[b, tokens.shape[1] - len(s):] for b, s in enumerate(seqs)], want)
    torch.testing.assert_close(torch.log_softmax(rest.float(), -1), left, rtol=TOL, atol=TOL)
