"""preprocess(): documents from jsonl / jsonl.zst -> one item per document, eod appended on request."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import zstandard

from megatron.data.indexed import MMapIndexedDataset
from megatron.data.preprocess import preprocess
from megatron.tokenizer import build_tokenizer

ROOT = Path(__file__).resolve().parents[2]
DOCS = ["hello world", "", "second doc\nwith two lines", "ünïcode ✓"]  # the empty doc is dropped


def write_jsonl(path, docs, compress=False):
    data = "".join(json.dumps({"text": d, "meta": {"i": i}}) + "\n" for i, d in enumerate(docs)).encode()
    path.write_bytes(zstandard.ZstdCompressor().compress(data) if compress else data)
    return str(path)


@pytest.mark.parametrize("compress,workers", [(False, 1), (True, 1), (True, 2)])
def test_preprocess_jsonl(tmp_path, compress, workers):
    src = write_jsonl(tmp_path / ("in.jsonl.zst" if compress else "in.jsonl"), DOCS, compress)
    tok = build_tokenizer("CharLevelTokenizer")
    stats = preprocess([src], tok, str(tmp_path / "out"), append_eod=True, workers=workers)
    assert stats["documents"] == 3 and stats["prefix"] == str(tmp_path / "out_text_document")
    ds = MMapIndexedDataset(stats["prefix"])
    kept = [d for d in DOCS if d]
    assert len(ds) == 3 and ds.doc_idx.tolist() == [0, 1, 2, 3] and ds.dtype.name == "uint16"
    for item, doc in zip(ds[0:3], kept):
        assert item[-1] == tok.eod and tok.detokenize(item[:-1]) == doc
    assert stats["tokens"] == int(ds.sizes.sum())


def test_no_eod_two_inputs_num_docs(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", ["aaa", "bb"])
    b = write_jsonl(tmp_path / "b.jsonl.zst", ["c"], compress=True)
    tok = build_tokenizer("CharLevelTokenizer")
    ds = MMapIndexedDataset(preprocess(f"{a},{b}", tok, str(tmp_path / "o"), key="code")["prefix"])
    assert [x.tolist() for x in ds[0:3]] == [[97] * 3, [98] * 2, [99]]
    stats = preprocess([a, b], tok, str(tmp_path / "p"), num_docs=2)
    assert stats["documents"] == 2


def test_missing_input(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        preprocess([str(tmp_path / "nope.jsonl")], build_tokenizer("CharLevelTokenizer"), str(tmp_path / "o"))


def test_cli(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", DOCS)
    cmd = [sys.executable, str(ROOT / "tools" / "preprocess_data.py"), "--input", src, "--tokenizer-type", "CharLevelTokenizer",
           "--output-prefix", str(tmp_path / "cli"), "--append-eod"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert "3 documents" in out and len(MMapIndexedDataset(str(tmp_path / "cli_text_document"))) == 3
    bad = subprocess.run(cmd + ["--dataset-impl", "lazy"], capture_output=True, text=True, check=False)
    assert bad.returncode != 0 and "use --dataset-impl mmap" in bad.stderr
