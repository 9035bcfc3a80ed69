"""Issue 23: `generate.py --max-new-tokens 1000000000` ran on silently (nothing printed until the
end, the kv-cache growing until memory ran out). The request is bounded by the memory the cache
needs before generating, and tokens are streamed to stdout as they come (megatron/generation.py)."""
import io

import pytest

from megatron.errors import UserError
from megatron.generation import TokenStream, check_new_tokens_fit, kv_cache_bytes_per_token
from megatron.model import GPTModel
from megatron.tokenizer import build_tokenizer


def test_tokens_are_written_as_they_come_and_characters_whole():
    tok = build_tokenizer("CharLevelTokenizer")
    out = io.StringIO()
    stream = TokenStream(tok, out)
    seen = []
    for t in tok.tokenize("ab é✓ c"):
        stream.push(t)
        seen.append(out.getvalue())
    stream.finish()
    assert out.getvalue() == "ab é✓ c"
    assert seen[:3] == ["a", "ab", "ab "]
    assert seen[3] == "ab " and seen[4] == "ab é"  # é is two bytes: written when whole, never as \ufffd
    assert all("\ufffd" not in s for s in seen)


def test_a_broken_tail_is_flushed_at_the_end():
    tok = build_tokenizer("CharLevelTokenizer")
    out = io.StringIO()
    stream = TokenStream(tok, out)
    for t in [104, 195]:  # 'h' and the first byte of a two-byte character
        stream.push(t)
    assert out.getvalue() == "h"
    stream.finish()
    assert out.getvalue() == tok.detokenize([104, 195])


def test_the_cache_bound_names_the_flag_and_what_fits(tiny_config, monkeypatch):
    model = GPTModel(tiny_config().model, 128)
    per_token = kv_cache_bytes_per_token(model, "cpu")
    assert per_token == 2 * 2 * 32 * 4  # k and v, 2 layers, hidden 32, fp32
    monkeypatch.setattr("megatron.generation.available_bytes", lambda device: 1 << 20)
    check_new_tokens_fit(model, 10, 100, "cpu")
    with pytest.raises(UserError, match=r"--max-new-tokens 1000000000: .* 10 \+ 1000000000 tokens needs .* "
                                        r"at most \d+ new tokens fit"):
        check_new_tokens_fit(model, 10, 10**9, "cpu")
    windowed = GPTModel(tiny_config(attention_window=16).model, 128)
    check_new_tokens_fit(windowed, 10, 10**9, "cpu")  # the cache keeps 16 keys whatever the length
