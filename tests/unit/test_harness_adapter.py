"""The lm-evaluation-harness adapter (megatron/evaluation/harness/adapter.py) against formulas
written here from the model's plain full-sequence logits: log p(continuation | context) is the
sum of log-softmax entries, rolling log-likelihood scores every token exactly once, greedy
generation (kv-cache) equals argmax decoding that re-runs the whole sequence each step."""
import pytest
import torch

from megatron.errors import UserError
from megatron.model import GPTModel
from megatron.tokenizer.char_level import CharLevelTokenizer

lm_eval = pytest.importorskip("lm_eval")
from lm_eval.api.instance import Instance  # noqa: E402

from megatron.evaluation.harness.adapter import KerpleLM  # noqa: E402
from megatron.evaluation.harness.batching import length_sorted_batches  # noqa: E402

VOCAB = 256  # byte-level tokenizer: every id is a byte
TOK = CharLevelTokenizer(VOCAB)


@pytest.fixture
def model(tiny_config):
    torch.manual_seed(0)
    cfg = tiny_config(padded_vocab_size=VOCAB)
    m = GPTModel(cfg.model, VOCAB).eval()
    with torch.no_grad():  # sharper logits, so an off-by-one position shows
        m.output_layer.weight.mul_(20)
    return m


def full_logprobs(model, ids: list[int]) -> torch.Tensor:
    """(len(ids), V) log-softmax of one plain forward over the whole sequence."""
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).float()[0], -1)


def reference_loglikelihood(model, ctx: list[int], cont: list[int]) -> tuple[float, bool]:
    ids = ctx + cont
    lp = full_logprobs(model, ids[:-1])
    rows = range(len(ctx) - 1, len(ids) - 1)  # row i predicts token i+1
    total = sum(float(lp[r, ids[r + 1]]) for r in rows)
    greedy = all(int(lp[r].argmax()) == ids[r + 1] for r in rows)
    return total, greedy


def requests(kind, args):
    return [Instance(kind, {}, a, i) for i, a in enumerate(args)]


PAIRS = [("The cat sat on the", " mat"), ("Return the", " value."), ("abc", "d"), ("xyz", "w"),
         ("Copy data from src", " to dst"), ("one two three", " four five")]


@pytest.mark.parametrize("batch_size", [1, 4])
def test_loglikelihood_equals_the_sum_of_log_softmax(model, batch_size):
    lm = KerpleLM(model, TOK, max_length=32, batch_size=batch_size)
    got = lm.loglikelihood(requests("loglikelihood", PAIRS), disable_tqdm=True)
    for (ctx, cont), (ll, greedy) in zip(PAIRS, got):
        # the harness moves the context's trailing space to the continuation; none here
        want, want_greedy = reference_loglikelihood(model, TOK.tokenize(ctx), TOK.tokenize(cont))
        assert ll == pytest.approx(want, abs=1e-4) and greedy == want_greedy
    assert any(not g for _, g in got)  # the sharp random model is not always greedy-right


def test_greedy_flag_is_true_when_the_continuation_is_the_argmax(model):
    ctx = TOK.tokenize("hello")
    lp = full_logprobs(model, ctx)[-1]
    lp[128:] = float("-inf")  # an ASCII character, so it detokenizes to one token
    nxt = chr(int(lp.argmax()))
    (_, greedy), = KerpleLM(model, TOK, 32).loglikelihood(requests("loglikelihood", [("hello", nxt)]),
                                                           disable_tqdm=True)
    assert greedy == (int(full_logprobs(model, ctx)[-1].argmax()) == ord(nxt))


def test_long_inputs_lose_tokens_on_the_left(model):
    """context + continuation longer than max_length + 1: the last max_length inputs are kept."""
    ctx, cont = "a long context of many many characters", " end"
    lm = KerpleLM(model, TOK, max_length=12)
    (ll, _), = lm.loglikelihood(requests("loglikelihood", [(ctx, cont)]), disable_tqdm=True)
    ids = TOK.tokenize(ctx + cont)[-13:]
    want, _ = reference_loglikelihood(model, ids[:-4], ids[-4:])
    assert ll == pytest.approx(want, abs=1e-4)


@pytest.mark.parametrize("max_length", [8, 64])
def test_rolling_scores_every_token_once(model, max_length):
    """The text in chunks of max_length tokens, each scored once, given the max_length tokens
    before its end in the eot-prefixed stream (so a short last chunk gets a long context)."""
    text = "def main(): return the answer to everything"
    ids = TOK.tokenize(text)
    stream = [TOK.eod] + ids  # stream[j + 1] == ids[j]
    assert len(ids) % 8
    want = 0.0
    for start in range(0, len(ids), max_length):
        end = min(start + max_length, len(ids))
        inputs = stream[max(0, end - max_length):end]  # the last row predicts ids[end - 1]
        lp = full_logprobs(model, inputs)[-(end - start):]
        want += sum(float(lp[i, t]) for i, t in enumerate(ids[start:end]))
    (got,) = KerpleLM(model, TOK, max_length).loglikelihood_rolling(requests("loglikelihood_rolling", [(text,)]),
                                                                     disable_tqdm=True)
    assert got == pytest.approx(want, abs=1e-4)


def greedy_without_cache(model, ids: list[int], steps: int) -> list[int]:
    new = []
    for _ in range(steps):  # argmax, re-running the whole sequence each step
        new.append(int(full_logprobs(model, ids + new)[-1].argmax()))
    return new


def test_generation_with_the_cache_is_greedy_decoding(model):
    from megatron.evaluation.harness.batching import generate

    ids = TOK.tokenize("def f(x):")
    (got,) = generate(model, [ids], [12], stop=lambda new: False)
    assert got == greedy_without_cache(model, ids, 12)


def test_generate_until_cuts_at_eot_and_the_stop_sequence(model):
    prompt = "def f(x):"
    new = greedy_without_cache(model, TOK.tokenize(prompt), 12)
    if TOK.eod in new:
        new = new[:new.index(TOK.eod)]
    lm = KerpleLM(model, TOK, max_length=32)
    (free,) = lm.generate_until(requests("generate_until", [(prompt, {"until": [], "max_gen_toks": 12})]),
                                disable_tqdm=True)
    assert free == TOK.detokenize(new)
    stop = free[len(free) // 2:len(free) // 2 + 2]
    (cut,) = lm.generate_until(requests("generate_until", [(prompt, {"until": [stop], "max_gen_toks": 12})]),
                               disable_tqdm=True)
    assert cut == free.split(stop)[0] and len(cut) < len(free)


def test_unsupported_generation_settings_are_named(model):
    lm = KerpleLM(model, TOK, max_length=32)
    with pytest.raises(UserError, match="top_p"):
        lm.generate_until(requests("generate_until", [("x", {"until": [], "top_p": 0.9})]), disable_tqdm=True)


def test_batches_are_length_sorted_longest_first():
    lengths = [3, 5, 3, 3, 5, 7]
    batches = length_sorted_batches(lengths, 2)
    assert sorted(i for b in batches for i in b) == list(range(6))
    assert batches == [[5, 1], [4, 0], [2, 3]]  # longest first, stable among equal lengths


def test_padded_scoring_batch_equals_one_at_a_time(model):
    """Requests of different lengths in one right-padded batch score what they score alone."""
    from megatron.evaluation.harness.batching import score_continuations

    reqs = [(TOK.tokenize(c + t)[:-1], TOK.tokenize(t)) for c, t in PAIRS]
    alone = score_continuations(model, reqs, batch_size=1)
    batched = score_continuations(model, reqs, batch_size=len(reqs))
    assert len({len(i) for i, _ in reqs}) > 1  # the batch really is padded
    for (a, ga), (b, gb) in zip(alone, batched):
        assert b == pytest.approx(a, abs=1e-5) and ga == gb


def test_batched_generation_equals_one_prompt_at_a_time(model):
    """Left-padded prompts of different lengths, generated together through the kv-cache, give
    each prompt the tokens greedy decoding gives it alone; a row that stops early keeps its stop."""
    from megatron.evaluation.harness.batching import generate

    prompts = [TOK.tokenize(p) for p in ("def f(x):", "ab", "return the value of")]
    budgets = [6, 9, 3]
    got = generate(model, prompts, budgets, stop=lambda new: False, batch_size=3)
    assert got == [greedy_without_cache(model, p, n) for p, n in zip(prompts, budgets)]
    first = greedy_without_cache(model, prompts[0], 1)[0]
    stopped = generate(model, prompts, budgets, stop=lambda new: new[-1] == first, batch_size=3)
    assert stopped[0] == [first] and stopped[1] == got[1][:len(stopped[1])]


def test_generate_until_batches_requests_with_the_same_settings(model):
    lm1, lm3 = KerpleLM(model, TOK, max_length=32), KerpleLM(model, TOK, max_length=32, batch_size=3)
    args = [("def f(x):", {"until": [], "max_gen_toks": 5}), ("ab", {"until": ["\n"], "max_gen_toks": 4}),
            ("import os", {"until": [], "max_gen_toks": 5}), ("x = ", {"until": [], "max_gen_toks": 5})]
    one = lm1.generate_until(requests("generate_until", args), disable_tqdm=True)
    batched = lm3.generate_until(requests("generate_until", args), disable_tqdm=True)
    assert batched == one


def test_max_length_beyond_training_is_allowed_where_positions_extrapolate(tiny_config):
    from megatron.evaluation.harness.run import resolve_max_length

    cfg = tiny_config(padded_vocab_size=VOCAB)  # kerple_log, seq-length 32
    assert resolve_max_length(None, GPTModel(cfg.model, VOCAB), cfg) == 32
    assert resolve_max_length(256, GPTModel(cfg.model, VOCAB), cfg) == 256
    learned = tiny_config(padded_vocab_size=VOCAB, pos_emb="learned")
    with pytest.raises(UserError, match="max-position-embeddings"):
        resolve_max_length(64, GPTModel(learned.model, VOCAB), learned)
    for bad in (0, 1, -5, 2.5, True):
        with pytest.raises(UserError, match="--max-length"):
            resolve_max_length(bad, GPTModel(cfg.model, VOCAB), cfg)


def test_extrapolated_max_length_scores_the_longer_context(model):
    """max-length 64 > the training length 32: the whole 50-token context is used (not cut)."""
    ctx, cont = "x" * 30 + " and then some more words", " here"
    (ll, _), = KerpleLM(model, TOK, max_length=64).loglikelihood(requests("loglikelihood", [(ctx, cont)]),
                                                                  disable_tqdm=True)
    want, _ = reference_loglikelihood(model, TOK.tokenize(ctx), TOK.tokenize(cont))
    assert len(TOK.tokenize(ctx + cont)) > 32 and ll == pytest.approx(want, abs=1e-4)
