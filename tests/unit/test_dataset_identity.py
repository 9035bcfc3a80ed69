"""Issue 23: a dataset has an identity (megatron/data/identity.py). An .idx from another build with
the same token count, and data written by another tokenizer whose ids fit the vocabulary, used to
be read silently (document boundaries changed; ppl 530, exit 0). Both are now refused, naming the
files (and both tokenizers) and the fix; a dataset without the sidecar still loads, noted once."""
import json
import shutil
import sys

import numpy as np
import pytest

from megatron.data import identity
from megatron.data.indexed import MMapIndexedDataset
from megatron.data.preprocess import preprocess
from megatron.errors import DataError
from megatron.tokenizer import build_tokenizer
from megatron.tokenizer.train_bpe import train_bytelevel_bpe
from tests.conftest import checkpoint_layout, train_config_dict, write_token_dataset, write_yaml

DOCS = [f"def func_{i}(x, y):\n    return x * {i} + y  # hello world {i % 7}\n" for i in range(120)]


@pytest.fixture(autouse=True)
def fresh_notes(monkeypatch):
    monkeypatch.setattr(identity, "_noted", set())
    monkeypatch.setattr(identity, "_checked", {})


def write_docs(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    return str(path)


def test_the_idx_of_another_build_with_the_same_token_count_is_refused(tmp_path):
    a = write_token_dataset(str(tmp_path / "a"), num_docs=40, seed=0)
    b = str(tmp_path / "b")
    # the same tokens, cut into documents differently: every structural check agrees
    src = MMapIndexedDataset(a)
    from megatron.data.indexed import MMapIndexedDatasetBuilder

    builder = MMapIndexedDatasetBuilder(b + ".bin", src.dtype)
    whole = [int(t) for i in range(len(src)) for t in src[i]]
    for s in range(0, len(whole), 50):
        builder.add_item(whole[s:s + 50])
        builder.end_document()
    builder.finalize(b + ".idx")
    assert (tmp_path / "a.bin").read_bytes() == (tmp_path / "b.bin").read_bytes()
    shutil.copy(b + ".idx", a + ".idx")
    with pytest.raises(DataError, match=r"a\.idx is not the \.idx that .*a\.identity\.json recorded.*different "
                                        r"builds.*preprocess_data\.py --overwrite"):
        MMapIndexedDataset(a)


def test_a_changed_bin_is_refused_and_the_check_reads_samples_only(tmp_path, monkeypatch):
    a = write_token_dataset(str(tmp_path / "a"), num_docs=40)
    raw = bytearray((tmp_path / "a.bin").read_bytes())
    raw[100] ^= 1
    (tmp_path / "a.bin").write_bytes(bytes(raw))
    with pytest.raises(DataError, match=r"a\.bin is not the \.bin that"):
        MMapIndexedDataset(a)
    big = tmp_path / "big.bin"  # 64 blocks of 64 KiB out of 64 MiB: 1/16 of the file is read
    big.write_bytes(b"\1" * (64 << 20))
    reads = []
    real_open = open

    class Counting:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.f.close()

        def seek(self, n):
            self.f.seek(n)

        def read(self, n=-1):
            data = self.f.read(n)
            reads.append(len(data))
            return data

    monkeypatch.setattr("builtins.open", lambda p, *a, **k: Counting(real_open(p, *a, **k)))
    fp = identity.file_fingerprint(str(big), identity.BIN_BLOCKS)
    assert sum(reads) == identity.BIN_BLOCKS * identity.BLOCK_BYTES and fp["bytes"] == 64 << 20


def test_preprocess_records_the_tokenizer_and_idx_stays_neox(tmp_path):
    tok = build_tokenizer("CharLevelTokenizer")
    prefix = preprocess([write_docs(tmp_path)], tok, str(tmp_path / "out"), append_eod=True)["prefix"]
    record = json.loads((tmp_path / "out_text_document.identity.json").read_text())
    assert record["format"] == identity.FORMAT and record["tokenizer"]["description"] == "CharLevelTokenizer"
    assert record["tokenizer"] == identity.tokenizer_identity(tok)
    assert (tmp_path / "out_text_document.idx").read_bytes()[:9] == b"MMIDIDX\x00\x00"
    assert len(MMapIndexedDataset(prefix)) == len(DOCS)


def test_a_dataset_without_identity_loads_with_one_note(tmp_path, capsys):
    prefix = write_token_dataset(str(tmp_path / "neox"))
    (tmp_path / "neox.identity.json").unlink()
    capsys.readouterr()
    for _ in range(3):
        assert len(MMapIndexedDataset(prefix)) == 200
    err = capsys.readouterr().err
    assert err.count("dataset identity unchecked") == 1 and "neox.identity.json" in err


def test_without_identity_an_idx_of_the_documents_in_another_order_is_refused(tmp_path, capsys):
    """Issue 35: no sidecar, the same documents in another order: same sizes, so the pointers add up
    and the .bin has exactly the size the index needs. The documents must end on the .bin's
    end-of-document token (write_token_dataset appends 0 to each)."""
    from megatron.data.indexed import write_index

    prefix = write_token_dataset(str(tmp_path / "neox"), num_docs=60, seed=3)
    (tmp_path / "neox.identity.json").unlink()
    right = MMapIndexedDataset(prefix)
    assert len(right) == 60 and all(int(right[i][-1]) == 0 for i in range(60))
    order = np.random.RandomState(0).permutation(60)
    write_index(prefix + ".idx", right.dtype, right.sizes[order], np.arange(61))
    with pytest.raises(DataError) as e:
        MMapIndexedDataset(prefix)
    msg = str(e.value)
    assert msg.startswith(f"{prefix}.idx does not fit {prefix}.bin: its document boundaries do not fall on the "
                          ".bin's end-of-document token 0")
    assert "neox.identity.json" in msg and "preprocess_data.py" in msg
    # data whose documents end on no particular token (no end-of-document appended): nothing to hold it to
    plain = str(tmp_path / "plain")
    from megatron.data.indexed import MMapIndexedDatasetBuilder

    builder = MMapIndexedDatasetBuilder(plain + ".bin", np.uint16)
    rng = np.random.RandomState(1)
    for _ in range(60):
        builder.add_item(rng.randint(1, 120, rng.randint(30, 120)))
        builder.end_document()
    builder.finalize(plain + ".idx")
    (tmp_path / "plain.identity.json").unlink()
    assert len(MMapIndexedDataset(plain)) == 60


@pytest.fixture
def other_tokenizer_data(tmp_path):
    """Data written by a small byte-level BPE (ids < 300), read by a config naming CharLevelTokenizer
    (512 ids): every id fits, so only the identity can tell."""
    vocab = str(tmp_path / "bpe.json")
    train_bytelevel_bpe(DOCS, 300, vocab)
    tok = build_tokenizer("HFTokenizer", vocab)
    prefix = preprocess([write_docs(tmp_path)], tok, str(tmp_path / "bpe"), append_eod=True)["prefix"]
    assert max(int(MMapIndexedDataset(prefix)[i].max()) for i in range(len(DOCS))) < 300
    return prefix, vocab


def test_data_of_another_tokenizer_is_refused_at_train_time(tmp_path, other_tokenizer_data):
    from megatron.config import load_config
    from megatron.training.data_setup import build_datasets

    prefix, vocab = other_tokenizer_data
    cfg = load_config([write_yaml(tmp_path / "c.yml", train_config_dict(tmp_path, prefix))])  # CharLevelTokenizer
    with pytest.raises(DataError) as e:
        build_datasets(cfg, 4, vocab_size=512)
    msg = str(e.value)
    assert f"HFTokenizer (vocab-file {vocab})" in msg and "CharLevelTokenizer" in msg
    assert "Set tokenizer-type/vocab-file" in msg and "preprocess_data.py --tokenizer-type CharLevelTokenizer" in msg
    ok = load_config([write_yaml(tmp_path / "ok.yml", train_config_dict(
        tmp_path, prefix, tokenizer_type="HFTokenizer", vocab_file=vocab))])
    train, _, _ = build_datasets(ok, 4, vocab_size=512)  # the tokenizer that wrote it
    assert train[0]["text"].max() < 300


def test_data_of_another_tokenizer_is_refused_at_evaluation(tmp_path, other_tokenizer_data, monkeypatch, capsys):
    from megatron import errors
    from megatron.checkpoint import load_model as load_mod
    from megatron.config import load_config
    from megatron.evaluation import sweep as evaluate
    from megatron.model import GPTModel

    prefix, vocab = other_tokenizer_data
    cfg = load_config([write_yaml(tmp_path / "c.yml", train_config_dict(tmp_path, prefix, padded_vocab_size=512))])
    model = GPTModel(cfg.model, 512).eval()
    monkeypatch.setattr(load_mod, "load_checkpoint_model", lambda *a, **k: (model, cfg, {"iteration": 4}))
    monkeypatch.delenv(errors.DEBUG_ENV, raising=False)
    monkeypatch.setattr(sys, "argv", ["evaluate.py", "--checkpoint", checkpoint_layout(tmp_path / "ck"), "--lengths",
                                      "16", "--max-windows", "2", "--out", str(tmp_path / "eval"), "--quiet"])
    with pytest.raises(SystemExit) as e:
        errors.run_cli(evaluate.main, "evaluate.py", expected=(ValueError,))
    err = capsys.readouterr().err
    assert e.value.code == errors.EXIT_USER_ERROR and "Traceback" not in err
    assert f"HFTokenizer (vocab-file {vocab})" in err and "CharLevelTokenizer" in err
    assert not (tmp_path / "eval" / "eval.json").exists()


def test_the_trainer_refuses_before_building_its_engine(tmp_path, other_tokenizer_data, monkeypatch):
    from megatron.config import load_config
    from megatron.training.trainer import Trainer

    prefix, vocab = other_tokenizer_data
    cfg = load_config([write_yaml(tmp_path / "c.yml", train_config_dict(tmp_path, prefix, padded_vocab_size=512))])
    monkeypatch.setattr(Trainer, "_build_engine", lambda self, ds: pytest.fail("the engine was built first"))
    with pytest.raises(DataError, match=rf"written by the tokenizer HFTokenizer \(vocab-file {vocab}\)"):
        Trainer(cfg)
