"""Every tokenizer type round-trips text, exposes vocab_size/eod, and fails clearly on bad files."""
import base64
import json
import pickle

import pytest
from tokenizers import pre_tokenizers

from megatron.tokenizer import TOKENIZER_TYPES, build_tokenizer, padded_vocab_size
from megatron.tokenizer.train_bpe import train_bytelevel_bpe

TEXT = "def hello(world):\n    return world + 1  # héllo wörld\n\n\tx = 'tab'\n"
CORPUS = [f"def func_{i}(x, y):\n    return x * {i} + y  # hello world {i % 7}\n" for i in range(300)]


def test_hf_tokenizer_round_trip(tmp_path):
    path = str(tmp_path / "tokenizer.json")
    train_bytelevel_bpe(CORPUS, 300, path)
    tok = build_tokenizer("HFTokenizer", path)
    assert tok.name == "HFTokenizer" and tok.vocab_size == 300 and tok.eod == 0 and tok.pad == 1
    ids = tok.tokenize(TEXT)
    assert tok.detokenize(ids) == TEXT
    assert tok.tokenize_batch([TEXT, "x"]) == [ids, tok.tokenize("x")]
    assert len(tok.tokenize(CORPUS[5])) < len(CORPUS[5])  # merges were learned
    assert pickle.loads(pickle.dumps(tok)).tokenize(TEXT) == ids


def test_char_level():
    tok = build_tokenizer("CharLevelTokenizer")
    assert tok.vocab_size == 512 and tok.eod == 0
    ids = tok.tokenize(TEXT)
    assert max(ids) < 256 and tok.detokenize(ids) == TEXT


def test_spm_round_trip(tmp_path):
    spm = pytest.importorskip("sentencepiece")
    prefix = str(tmp_path / "spm")
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS * 3), model_prefix=prefix, vocab_size=100,
                                   model_type="bpe", user_defined_symbols=["<|endoftext|>"], hard_vocab_limit=False,
                                   character_coverage=1.0, num_threads=1, minloglevel=2)
    tok = build_tokenizer("SPMTokenizer", prefix + ".model")
    assert tok.vocab_size <= 100 and tok.eod == tok.sp.piece_to_id("<|endoftext|>")
    line = "def func_3(x, y): return x * 3 + y"
    assert tok.detokenize(tok.tokenize(line)) == line


def tiny_gpt2_files(tmp_path):
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    merges = [("h", "e"), ("l", "l"), ("he", "ll"), ("Ġ", "w")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    return str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"), vocab


def test_gpt2_bpe_vocab_and_merges(tmp_path):
    vocab_file, merge_file, vocab = tiny_gpt2_files(tmp_path)
    tok = build_tokenizer("GPT2BPETokenizer", vocab_file, merge_file)
    assert tok.vocab_size == 261 and tok.eod == 260
    ids = tok.tokenize("hello world")
    assert ids[0] == vocab["hell"] and vocab["Ġw"] in ids
    assert tok.detokenize(ids) == "hello world" and tok.detokenize(tok.tokenize(TEXT)) == TEXT


def write_tiktoken(path, merges=(b"he", b"ll", b"hell", b" w")):
    ranks = [bytes([i]) for i in range(256)] + list(merges)
    path.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for r, t in enumerate(ranks)))
    return str(path)


@pytest.mark.parametrize("tokenizer_type", ["TiktokenTokenizer", "GPT2BPETokenizer"])
def test_tiktoken_file(tmp_path, tokenizer_type):
    path = write_tiktoken(tmp_path / "tiny.tiktoken")
    tok = build_tokenizer(tokenizer_type, path)
    assert tok.name == tokenizer_type
    assert tok.vocab_size == 261 and tok.eod == 260  # GPT-2 layout: eod right after the last rank (50256)
    ids = tok.tokenize("hello world<|endoftext|>")  # special text inside a doc is ordinary text
    assert ids[0] == 258 and 259 in ids and 260 not in ids
    assert tok.detokenize(ids) == "hello world<|endoftext|>" and tok.detokenize(tok.tokenize(TEXT)) == TEXT
    assert pickle.loads(pickle.dumps(tok)).name == tokenizer_type


def test_padded_vocab_size():
    assert padded_vocab_size(50257) == 50304
    assert padded_vocab_size(50257, 128, 2) == 50432
    assert padded_vocab_size(50304) == 50304 and padded_vocab_size(1, 8) == 8


def test_unknown_type_lists_valid_ones():
    with pytest.raises(ValueError, match="unknown tokenizer-type 'BertTokenizer'.*HFTokenizer"):
        build_tokenizer("BertTokenizer")
    assert "HFTokenizer" in TOKENIZER_TYPES and len(TOKENIZER_TYPES) == 5


@pytest.mark.parametrize("tokenizer_type", ["HFTokenizer", "SPMTokenizer", "TiktokenTokenizer", "GPT2BPETokenizer"])
def test_missing_vocab_file(tmp_path, tokenizer_type):
    with pytest.raises(ValueError, match="`vocab-file`.*not a readable file"):
        build_tokenizer(tokenizer_type, str(tmp_path / "nope"), str(tmp_path / "nope.txt"))
    with pytest.raises(ValueError, match="needs `vocab-file`"):
        build_tokenizer(tokenizer_type, None)


def test_missing_merge_file_and_bad_json(tmp_path):
    vocab_file, _, _ = tiny_gpt2_files(tmp_path)
    with pytest.raises(ValueError, match="`merge-file`.*merges.txt"):
        build_tokenizer("GPT2BPETokenizer", vocab_file, str(tmp_path / "missing.txt"))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="HFTokenizer.*not a Hugging Face tokenizers JSON"):
        build_tokenizer("HFTokenizer", str(tmp_path / "bad.json"))


def test_config_and_tools_take_the_tokenizer_package_names():
    # one list of tokenizer types (megatron/tokenizer/types.py): the config accepts those plus the
    # NeoX name it refuses at build time with the fix
    from megatron.config.data import DataConfig
    from megatron.config.fields import choices_of
    from megatron.config.schema import KEYS
    from megatron.tokenizer.types import NEOX_ONLY_TYPES, TOKENIZER_FILES

    assert choices_of(KEYS["tokenizer_type"].field) == TOKENIZER_TYPES + NEOX_ONLY_TYPES
    assert set(TOKENIZER_FILES) <= set(TOKENIZER_TYPES)
    assert DataConfig.__dataclass_fields__["tokenizer_type"].default in TOKENIZER_TYPES
    for name in NEOX_ONLY_TYPES:
        with pytest.raises(ValueError, match=f"tokenizer-type {name} needs a download"):
            build_tokenizer(name)


def test_reading_a_config_stays_light():
    # the config takes its tokenizer names from megatron.tokenizer.types; that must not load the
    # tokenizer libraries (or torch) for a process that only reads a config
    import subprocess
    import sys

    code = ("import sys, megatron.config; "
            "print(sorted(m for m in ('torch', 'tiktoken', 'tokenizers', 'sentencepiece') if m in sys.modules))")
    from tests.conftest import ROOT

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
