"""tools/prepare_data.py stdlib on a small slice: archive, tokenizer and dataset agree end to end."""
import lm_dataformat
import numpy as np
import pytest

from megatron.data.corpora import get_corpus
from megatron.data.corpora.prepare import prepare_corpus
from megatron.data.gpt_dataset import build_train_valid_test_datasets
from megatron.data.indexed import MMapIndexedDataset
from megatron.tokenizer import build_tokenizer


def test_prepare_stdlib_slice(tmp_path):
    logs = []
    s = prepare_corpus("stdlib", str(tmp_path), vocab_size=512, max_files=25, log=logs.append)
    assert s["files"] == s["documents"] == 25 and s["vocab_size"] == 512 and s["tokens"] > 0
    docs = list(lm_dataformat.Reader(s["archive"]).stream_data(get_meta=True))
    assert len(docs) == 25 and all(meta["path"].endswith(".py") for _, meta in docs)
    assert not any("/test/" in f"/{meta['path']}" for _, meta in docs)

    tok = build_tokenizer("HFTokenizer", s["tokenizer"])
    assert tok.eod == 0 and tok.tokenizer.token_to_id("<|padding|>") == 1
    ds = MMapIndexedDataset(s["data_prefix"])
    assert len(ds) == 25 and int(ds.sizes.sum()) == s["tokens"]
    for (text, _), item in zip(docs[:5], ds[0:5]):
        assert item[-1] == tok.eod and tok.detokenize(item[:-1]) == text

    train, valid, _ = build_train_valid_test_datasets(s["data_prefix"], "9,1,0", 64, 1, (10, 2, 0))
    assert train[0]["text"].shape == (65,) and valid[1]["text"].dtype == np.int64

    logs.clear()
    again = prepare_corpus("stdlib", str(tmp_path), vocab_size=512, max_files=25, log=logs.append)
    assert logs == [f"[{step}] exists, skipping" for step in ("corpus", "tokenizer", "tokens")]
    assert again["tokens"] == s["tokens"]
    logs.clear()
    prepare_corpus("stdlib", str(tmp_path), vocab_size=400, max_files=25, log=logs.append)
    assert logs[0] == "[corpus] exists, skipping" and logs[1].startswith("[tokenizer] built")  # new vocab rebuilds


def test_stdlib_documents_are_deduplicated_and_in_fixed_shuffled_order():
    stats = {}
    docs = list(get_corpus("stdlib").documents(max_mb=0.5, stats=stats))
    paths = [meta["path"] for _, meta in docs]
    again = [meta["path"] for _, meta in get_corpus("stdlib").documents(max_mb=0.5)]
    assert paths == again  # deterministic
    assert paths != sorted(paths)  # shuffled, so NeoX's contiguous splits are representative
    assert len(set(paths)) == len(paths) and stats["files"] == len(paths)
    last = len(docs[-1][0].encode())
    assert stats["bytes"] - last < 0.5e6 <= stats["bytes"]  # stopped right after crossing max_mb


def test_unknown_corpus():
    with pytest.raises(ValueError, match="unknown corpus 'nope'; available: .*stdlib.*wiki"):
        get_corpus("nope")
