"""preprocess(): documents from jsonl / jsonl.zst -> one item per document, eod appended on request."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zstandard

from megatron.data.indexed import MMapIndexedDataset
from megatron.data.preprocess import preprocess
from megatron.errors import DataError, UserError
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


# ------------------------------------------------------------------- bad inputs: one clear error, nothing lost

TRUNCATED = zstandard.ZstdCompressor().compress(b"".join(b'{"text": "doc %d"}\n' % i for i in range(500)))[:-20]
FLIPPED = bytearray(zstandard.ZstdCompressor(write_checksum=True).compress(b'{"text": "some words"}\n' * 300))
FLIPPED[len(FLIPPED) // 2] ^= 0xFF  # one bit-rotten byte: the frame checksum catches it
BAD_INPUTS = {  # file name -> (content, the error it must give)
    "broken.jsonl": (b'{"text": "ok"}\n{"text": "no end\n', r"broken\.jsonl:2: invalid JSON"),
    "nul.jsonl": (b'{"text": "ok"}\n\x00\x00\x00\n', r"nul\.jsonl:2: the line contains a NUL byte"),
    "null.jsonl": (b'{"text": "ok"}\n{"text": null}\n', r'null\.jsonl:2: "text" is null, not a string'),
    "nokey.jsonl": (b'{"body": "x", "meta": {}}\n', r'nokey\.jsonl:1: no "text" key \(keys: body, meta\)'),
    "utf.jsonl": (b'{"text": "\xff"}\n', r"utf\.jsonl:1: not UTF-8"),
    "garbage.jsonl.zst": (b"this is not zstd at all", r"garbage\.jsonl\.zst cannot be decompressed .*not zstd"),
    "flipped.jsonl.zst": (FLIPPED, r"flipped\.jsonl\.zst cannot be decompressed \(.*checksum\): not zstd, or corrupt"),
    "cut.jsonl.zst": (TRUNCATED, r"cut\.jsonl\.zst is truncated: its zstd stream ends in the middle of a frame"),
    "empty.jsonl": (b"\n\n", r"no documents in .*empty\.jsonl.*existing .*out_text_document\.bin/\.idx are unchanged"),
}


def cli(tmp_path, src, *extra, workers=2):
    cmd = [sys.executable, str(ROOT / "tools" / "preprocess_data.py"), "--input", str(src), "--tokenizer-type",
           "CharLevelTokenizer", "--output-prefix", str(tmp_path / "out"), "--workers", str(workers), *extra]
    env = {k: v for k, v in os.environ.items() if k != "KERPLE_DEBUG"}  # the message as a user sees it
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False, env=env)  # a hang fails the test


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_bad_input_is_one_error_and_the_old_dataset_survives(tmp_path, name):
    """With 2 workers (docs/data.md's command) a broken line used to hang forever; now every bad input
    is one message naming the file (and line), exit 2, and the dataset already there is untouched."""
    preprocess([write_jsonl(tmp_path / "good.jsonl", ["the good corpus"])], build_tokenizer("CharLevelTokenizer"),
               str(tmp_path / "out"))
    before = {p.name: p.read_bytes() for p in tmp_path.glob("out_*")}
    content, message = BAD_INPUTS[name]
    (tmp_path / name).write_bytes(content)
    proc = cli(tmp_path, tmp_path / name, "--overwrite")
    assert proc.returncode == 2, proc.stderr
    assert re.search(message, proc.stderr) and "Traceback" not in proc.stderr, proc.stderr
    assert {p.name: p.read_bytes() for p in tmp_path.glob("out_*")} == before  # no .tmp left, nothing replaced


def test_existing_dataset_needs_overwrite(tmp_path):
    a, b = write_jsonl(tmp_path / "a.jsonl", ["first"]), write_jsonl(tmp_path / "b.jsonl", ["second", "third"])
    assert cli(tmp_path, a, workers=1).returncode == 0
    proc = cli(tmp_path, b, workers=1)
    assert proc.returncode == 2 and re.search(r"out_text_document\.bin and .* already exist.*--overwrite", proc.stderr)
    assert len(MMapIndexedDataset(str(tmp_path / "out_text_document"))) == 1
    assert cli(tmp_path, b, "--overwrite", workers=1).returncode == 0
    assert len(MMapIndexedDataset(str(tmp_path / "out_text_document"))) == 2


def test_multi_frame_zst_is_read_to_the_end(tmp_path):
    frames = [zstandard.ZstdCompressor().compress(json.dumps({"text": t}).encode() + b"\n") for t in ("a", "bb", "ccc")]
    (tmp_path / "in.jsonl.zst").write_bytes(b"".join(frames))
    stats = preprocess([str(tmp_path / "in.jsonl.zst")], build_tokenizer("CharLevelTokenizer"), str(tmp_path / "o"))
    assert stats["documents"] == 3 and stats["tokens"] == 6


class Unpicklable(Exception):
    def __init__(self, text, code):  # two required arguments: unpickling it in the parent fails
        super().__init__(f"cannot tokenize {text!r} ({code})")


class FailingTokenizer:
    vocab_size, eod = 300, 0

    def tokenize_batch(self, texts):
        if any("BOOM" in t for t in texts):
            raise Unpicklable("BOOM", 7)
        return [[ord(c) for c in t] for t in texts]


@pytest.mark.parametrize("workers", [1, 2])
def test_tokenizer_failure_in_a_worker_names_the_document(tmp_path, workers):
    src = write_jsonl(tmp_path / "in.jsonl", ["fine", "also fine", "a BOOM here", "never reached"])
    with pytest.raises(DataError, match=r"in\.jsonl:3: the tokenizer failed on this document \(Unpicklable: "):
        preprocess([src], FailingTokenizer(), str(tmp_path / "o"), workers=workers)
    assert list(tmp_path.glob("o_*")) == []


def test_killed_run_leaves_no_temporaries(tmp_path):
    """SIGTERM (a job's time limit) and Ctrl-C end the run without a .bin.tmp left behind."""
    src = write_jsonl(tmp_path / "big.jsonl", [f"document number {i} " * 20 for i in range(50_000)])
    for sig in (signal.SIGTERM, signal.SIGINT):
        cmd = [sys.executable, str(ROOT / "tools" / "preprocess_data.py"), "--input", src, "--tokenizer-type",
               "CharLevelTokenizer", "--output-prefix", str(tmp_path / "out"), "--log-interval", "0"]
        env = {k: v for k, v in os.environ.items() if k != "KERPLE_DEBUG"}
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        deadline = time.time() + 60
        while not any(p.stat().st_size for p in tmp_path.glob("out_*.tmp*")) and proc.poll() is None \
                and time.time() < deadline:  # wait until tokens are being written
            time.sleep(0.01)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 128 + sig and "Traceback" not in err, err
        assert list(tmp_path.glob("out_*")) == [], (sig, err)


class DyingTokenizer(FailingTokenizer):
    def tokenize_batch(self, texts):
        if any("DIE" in t for t in texts):
            os._exit(1)  # a worker killed (e.g. for memory): the pool used to wait forever
        return super().tokenize_batch(texts)


def test_dead_worker_is_an_error_not_a_hang(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", ["fine", "DIE here"])
    with pytest.raises(UserError, match=r"a tokenizer worker process died .*in\.jsonl:1 on.*fewer --workers"):
        preprocess([src], DyingTokenizer(), str(tmp_path / "o"), workers=2)
    assert list(tmp_path.glob("o_*")) == []


def test_stale_temporaries_of_a_killed_run_are_cleaned_by_the_next(tmp_path):
    """SIGKILL leaves `<prefix>.bin.tmp<pid>` (nothing runs at SIGKILL); the next run on the same
    prefix removes those of dead writers and keeps a live writer's."""
    src = write_jsonl(tmp_path / "in.jsonl", DOCS)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    prefix = tmp_path / "out_text_document"
    stale = [Path(f"{prefix}.bin.tmp{dead.pid}"), Path(f"{prefix}.idx.tmp{dead.pid}"),
             Path(f"{prefix}.identity.json.tmp{dead.pid}")]
    live = Path(f"{prefix}.bin.tmp{os.getppid()}")  # a running process: its writer may still be busy
    for p in [*stale, live]:
        p.write_bytes(b"x" * 100)
    preprocess([src], build_tokenizer("CharLevelTokenizer"), str(tmp_path / "out"))
    assert not any(p.exists() for p in stale) and live.exists()


@pytest.mark.parametrize("flag,value", [("--num-docs", "-1"), ("--num-docs", "0"), ("--workers", "0")])
def test_negative_counts_name_the_flag(tmp_path, flag, value):
    """Issue 23: --num-docs -1 ended in islice's traceback-free but flagless ValueError."""
    src = write_jsonl(tmp_path / "in.jsonl", DOCS)
    cmd = [sys.executable, str(ROOT / "tools" / "preprocess_data.py"), "--input", src, "--tokenizer-type",
           "CharLevelTokenizer", "--output-prefix", str(tmp_path / "o"), flag, value]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"argument {flag}: must be an integer >= 1, got '{value}'" in proc.stderr
    assert not list(tmp_path.glob("o_*"))
    with pytest.raises(DataError, match=r"num_docs \(--num-docs\) must be >= 1, got -1"):
        preprocess([src], build_tokenizer("CharLevelTokenizer"), str(tmp_path / "o"), num_docs=-1)
