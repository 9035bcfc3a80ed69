"""GPT2Dataset index building: NeoX split/epoch/sample semantics, caching and eval windows."""
import os

import numpy as np
import pytest
import torch

from megatron.data.gpt_dataset import (
    GPTDataset,
    build_doc_idx,
    build_eval_windows,
    build_sample_idx,
    build_train_valid_test_datasets,
    num_epochs_needed,
    split_ranges,
)
from megatron.data.indexed import MMapIndexedDataset, MMapIndexedDatasetBuilder
from megatron.errors import DataError


def loop_sample_idx(sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch):
    """Straight transcription of NeoX's python/C++ loop, the reference for the vectorised version."""
    num_samples = (num_epochs * tokens_per_epoch - 1) // seq_length
    out = np.zeros([num_samples + 1, 2], dtype=np.int64)
    doc_pos, offset = 0, 0
    for k in range(1, num_samples + 1):
        remaining = seq_length + 1
        while remaining != 0:
            length = sizes[doc_idx[doc_pos]] - offset
            remaining -= length
            if remaining <= 0:
                offset += remaining + length - 1
                remaining = 0
            else:
                doc_pos, offset = doc_pos + 1, 0
        out[k] = (doc_pos, offset)
    return out


def make_dataset(tmp_path, sizes, seed=0, name="ds"):
    rng = np.random.RandomState(seed)
    prefix = str(tmp_path / name)
    b = MMapIndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16, overwrite=True)
    for n in sizes:
        b.add_item(rng.randint(0, 60000, size=n))
        b.end_document()
    b.finalize(prefix + ".idx")
    return prefix


@pytest.mark.parametrize("n,split,expected", [
    (1000, "949,50,1", [(0, 949), (949, 999), (999, 1000)]),
    (100, "969, 30, 1", [(0, 97), (97, 100), (100, 100)]),
    (10, "1", [(0, 10), (10, 10), (10, 10)]),
    (10, "8/1/1", [(0, 8), (8, 9), (9, 10)]),
    (7, "1,1,1", [(0, 3), (3, 5), (5, 7)]),  # 2+2+2 = 6: NeoX shifts EVERY boundary by +1
])
def test_split_ranges(n, split, expected):
    assert split_ranges(n, split) == expected


@pytest.mark.parametrize("bad", ["", "a,b", "1,2,3,4", "0,0,0", "-1,2"])
def test_split_ranges_bad(bad):
    with pytest.raises(ValueError, match="bad split"):
        split_ranges(10, bad)


def test_num_epochs():
    assert num_epochs_needed(100, 10, 9) == 1
    assert num_epochs_needed(100, 10, 10) == 2  # (100-1)//10 = 9 < 10


@pytest.mark.parametrize("seed", range(6))
def test_vectorised_sample_idx_equals_loop(seed):
    rng = np.random.RandomState(seed)
    sizes = rng.randint(0 if seed % 2 else 1, 30, size=40).astype(np.int32)  # odd seeds include empty docs
    sizes[0] = max(sizes[0], 1)
    documents = np.arange(3, 37, dtype=np.int32)
    tokens = int(sizes[documents].sum())
    for seq_length in (1, 2, 7, 16, 64):
        epochs = num_epochs_needed(tokens, seq_length, 50)
        doc_idx = build_doc_idx(documents, epochs, np.random.RandomState(seed))
        got = build_sample_idx(sizes, doc_idx, seq_length, epochs, tokens)
        want = loop_sample_idx(sizes, doc_idx, seq_length, epochs, tokens)
        np.testing.assert_array_equal(got, want)


def test_samples_have_shared_boundary_tokens(tmp_path):
    prefix = make_dataset(tmp_path, [5, 17, 3, 40, 1, 9, 22])
    indexed = MMapIndexedDataset(prefix)
    ds = GPTDataset("train", prefix, np.arange(7, dtype=np.int32), indexed, 30, 8, seed=1, shuffle=False)
    stream = np.concatenate([indexed[int(d)] for d in ds.doc_idx])
    assert len(ds) >= 30
    for k in range(len(ds)):
        x = ds[k]["text"]
        assert x.dtype == np.int64 and x.shape == (9,)
        np.testing.assert_array_equal(x, stream[8 * k: 8 * k + 9])  # consecutive samples share x[-1]


@pytest.mark.parametrize("seq_length", [4, 16, 50])
def test_eval_windows_cover_one_epoch_without_overlap(tmp_path, seq_length):
    prefix = make_dataset(tmp_path, [30, 3, 55, 12, 80, 7, 41, 2, 19, 33])
    ds = build_eval_windows(prefix, "1,1,0", "valid", seq_length, seed=3, cache_dir=str(tmp_path / "c"))
    indexed = MMapIndexedDataset(prefix)
    documents = np.arange(*split_ranges(10, "1,1,0")[1])
    tokens = int(indexed.sizes[documents].sum())
    assert ds.num_epochs == 1 and len(ds) == (tokens - 1) // seq_length
    assert sorted(int(d) for d in ds.doc_idx) == documents.tolist()  # one epoch, shuffled
    stream = np.concatenate([indexed[int(d)] for d in ds.doc_idx])
    # default: windows in stream order, so window i starts at i * seq_length
    for i in range(len(ds)):
        np.testing.assert_array_equal(ds[i]["text"], stream[i * seq_length: i * seq_length + seq_length + 1])
    # NeoX's shuffled sample order serves the same windows, permuted: targets tile the stream once
    shuffled = build_eval_windows(prefix, "1,1,0", "valid", seq_length, seed=3, cache_dir=str(tmp_path / "c"),
                                  stream_order=False)
    starts = sorted(int(shuffled.shuffle_idx[i]) * seq_length for i in range(len(shuffled)))
    assert starts == list(range(0, len(shuffled) * seq_length, seq_length))
    for i in range(len(shuffled)):
        start = int(shuffled.shuffle_idx[i]) * seq_length
        np.testing.assert_array_equal(shuffled[i]["text"], stream[start: start + seq_length + 1])
    short = build_eval_windows(prefix, "1,1,0", "valid", seq_length, seed=3, max_windows=2, cache_dir=str(tmp_path / "c"))
    assert len(short) == 2 and np.array_equal(short[1]["text"], ds[1]["text"])


def test_eval_windows_at_two_lengths_cover_the_same_leading_tokens(tmp_path):
    prefix = make_dataset(tmp_path, [30, 3, 55, 12, 80, 7, 41, 2, 19, 33])
    a = build_eval_windows(prefix, "1,1,0", "valid", 8, seed=3, max_windows=4, cache_dir=str(tmp_path / "c"))
    b = build_eval_windows(prefix, "1,1,0", "valid", 16, seed=3, max_windows=2, cache_dir=str(tmp_path / "c"))
    targets_a = np.concatenate([a[i]["text"][1:] for i in range(4)])
    targets_b = np.concatenate([b[i]["text"][1:] for i in range(2)])
    np.testing.assert_array_equal(targets_a, targets_b)


def test_cache_files_written_then_loaded(tmp_path, capsys):
    prefix = make_dataset(tmp_path, [50] * 20)
    train, valid, test = build_train_valid_test_datasets(prefix, "8,2,0", 16, 1234, (100, 10, 0), seq_length_val=32)
    assert test is None and train.seq_length == 16 and valid.seq_length == 32
    names = sorted(os.listdir(tmp_path))
    for kind in ("doc", "sample", "shuffle"):
        assert f"ds_train_indexmap_100ns_16sl_1234s_{kind}_idx.npy" in names
        assert f"ds_valid_indexmap_10ns_32sl_1234s_{kind}_idx.npy" in names
    assert capsys.readouterr().out.count("built") == 2
    train2, _, _ = build_train_valid_test_datasets(prefix, "8,2,0", 16, 1234, (100, 10, 0), seq_length_val=32)
    assert "built" not in capsys.readouterr().out  # second build loads the cached maps
    assert isinstance(train2.sample_idx, np.memmap)
    np.testing.assert_array_equal(train2[5]["text"], train[5]["text"])
    assert len(train) >= 100 and train.num_epochs == num_epochs_needed(800, 16, 100)


def test_ranks_starting_together_build_the_maps_once(tmp_path, capsys, monkeypatch):
    """Two ranks of a run open the same split on a fresh cache at once: one builds the maps, the
    other waits and loads them (it used to build them as well, or find the first's half-written set
    and announce maps "built for other data ... or damaged")."""
    import threading
    import time

    prefix = make_dataset(tmp_path, [50] * 20)
    indexed = MMapIndexedDataset(prefix)
    built, build = [], GPTDataset._build

    def slow_build(self, *args):  # widens the window in which the other rank looks for the maps
        built.append(threading.get_ident())
        time.sleep(0.3)
        return build(self, *args)

    monkeypatch.setattr(GPTDataset, "_build", slow_build)
    start, results = threading.Barrier(2), []

    def rank():
        start.wait()
        results.append(GPTDataset("train", prefix, np.arange(16), indexed, 100, 16, 1234))

    threads = [threading.Thread(target=rank) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(built) == 1 and len(results) == 2
    out = capsys.readouterr().out
    assert out.count("built train index maps") == 1 and "damaged" not in out
    np.testing.assert_array_equal(results[0][7]["text"], results[1][7]["text"])


def test_read_only_data_dir_falls_back_to_cwd_cache(tmp_path, monkeypatch):
    prefix = make_dataset(tmp_path, [50] * 4)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(os, "access", lambda *a, **k: False)
    indexed = MMapIndexedDataset(prefix)
    GPTDataset("train", prefix, np.arange(4), indexed, 5, 8, seed=0)
    assert len(list((tmp_path / "cache" / "index_maps").glob("*.npy"))) == 3


def test_too_short_split(tmp_path):
    prefix = make_dataset(tmp_path, [10] * 10)
    with pytest.raises(ValueError, match=r"valid split .* 1 documents and 10 tokens.*seq_length\+1 = 33"):
        build_eval_windows(prefix, "9,1,0", "valid", 32, seed=0, cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"test split .* 0 documents and 0 tokens"):
        build_train_valid_test_datasets(prefix, "9,1,0", 4, 0, (10, 10, 10), cache_dir=str(tmp_path))


def test_cache_is_rebuilt_for_other_data_with_the_same_totals(tmp_path, capsys):
    """Same document count and token total, different documents: the cached maps used to be reused
    (a bare AssertionError, or silently wrong samples). They are keyed on the documents' sizes."""
    prefix = make_dataset(tmp_path, [50, 70, 60, 20])
    first = GPTDataset("train", prefix, np.arange(4), MMapIndexedDataset(prefix), 5, 8, seed=0)
    before = [first[i]["text"].tolist() for i in range(len(first))]
    prefix = make_dataset(tmp_path, [20, 60, 70, 50], seed=1)  # same prefix, 4 docs, 200 tokens, other sizes
    capsys.readouterr()
    ds = GPTDataset("train", prefix, np.arange(4), MMapIndexedDataset(prefix), 5, 8, seed=0)
    assert "were built for other data, have no _key.json" in capsys.readouterr().out
    fresh_dir = tmp_path / "fresh"
    fresh = GPTDataset("train", prefix, np.arange(4), MMapIndexedDataset(prefix), 5, 8, seed=0, cache_dir=str(fresh_dir))
    assert [ds[i]["text"].tolist() for i in range(len(ds))] == [fresh[i]["text"].tolist() for i in range(len(fresh))]
    assert [ds[i]["text"].tolist() for i in range(len(ds))] != before
    capsys.readouterr()
    GPTDataset("train", prefix, np.arange(4), MMapIndexedDataset(prefix), 5, 8, seed=0)
    assert "built" not in capsys.readouterr().out  # and then reused


@pytest.mark.parametrize("damage", ["torn", "garbage", "key"])
def test_torn_or_corrupt_cache_is_rebuilt(tmp_path, capsys, damage):
    prefix = make_dataset(tmp_path, [50] * 4)
    ref = GPTDataset("train", prefix, np.arange(4), MMapIndexedDataset(prefix), 5, 8, seed=0)
    expected = [ref[i]["text"].tolist() for i in range(len(ref))]
    sample = next(tmp_path.glob("*_sample_idx.npy"))
    if damage == "torn":
        sample.write_bytes(sample.read_bytes()[:-7])
    elif damage == "garbage":
        sample.write_bytes(b"\x00" * 64)
    else:
        next(tmp_path.glob("*_key.json")).write_text('{"key": ')
    capsys.readouterr()
    ds = GPTDataset("train", prefix, np.arange(4), MMapIndexedDataset(prefix), 5, 8, seed=0)
    assert "rebuilding" in capsys.readouterr().out
    assert [ds[i]["text"].tolist() for i in range(len(ds))] == expected
    assert not list(tmp_path.glob("*.tmp*"))


def test_token_ids_beyond_the_vocabulary_name_the_file(tmp_path):
    prefix = make_dataset(tmp_path, [50] * 4)  # ids up to 60000
    ds = GPTDataset("train", prefix, np.arange(4), MMapIndexedDataset(prefix), 5, 8, seed=0, vocab_size=1000)
    with pytest.raises(DataError, match=r"ds\.bin: train sample 0 holds token id \d+, outside the vocabulary of 1000 "
                                        r"ids.*rebuild it with tools/preprocess_data\.py and this model's tokenizer"):
        ds[0]
    ok = build_eval_windows(prefix, "1,1,0", "valid", 8, seed=0, cache_dir=str(tmp_path), vocab_size=60000)
    assert ok[0]["text"].max() < 60000
    loader = torch.utils.data.DataLoader(ds, num_workers=1)  # as in training: the error crosses a process
    with pytest.raises(DataError) as info:
        next(iter(loader))
    from megatron.errors import expected_message  # what the top-level handler prints: the one line

    message, _ = expected_message(info.value)
    assert message.startswith(f"{prefix}.bin: train sample 0 holds") and "Traceback" not in message


def test_training_datasets_check_the_vocabulary(tmp_path, token_dataset):
    from megatron.config import load_config
    from megatron.training.data_setup import build_datasets
    from tests.conftest import train_config_dict, write_yaml

    cfg = load_config([write_yaml(tmp_path / "c.yml", train_config_dict(tmp_path, token_dataset))])
    train, valid, _ = build_datasets(cfg, 4, vocab_size=120)  # the corpus' ids are 0..119
    assert train[0]["text"].max() < 120 and valid[0]["text"].max() < 120
    train, valid, _ = build_datasets(cfg, 4, vocab_size=2)
    for ds in (train, valid):
        with pytest.raises(DataError, match=rf"tiny_text_document\.bin: {ds.name} sample 0 holds token id .* of 2 ids"):
            ds[0]


def _build_in_child(prefix, queue):
    try:
        ds = GPTDataset("train", prefix, np.arange(40), MMapIndexedDataset(prefix), 500, 8, seed=0)
        queue.put(np.asarray(ds.shuffle_idx).tolist()[:50])
    except Exception as e:  # noqa: BLE001 - reported to the parent
        queue.put(repr(e))


def test_ranks_building_the_same_maps_at_once_agree(tmp_path):
    """Every rank builds the maps when none are cached; their atomic writes race harmlessly."""
    import multiprocessing as mp

    prefix = make_dataset(tmp_path, [37] * 40)
    ctx = mp.get_context("fork")
    for _ in range(3):
        for f in tmp_path.glob("*_indexmap_*"):
            f.unlink()
        queue = ctx.Queue()
        procs = [ctx.Process(target=_build_in_child, args=(prefix, queue)) for _ in range(4)]
        for p in procs:
            p.start()
        results = [queue.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        assert all(r == results[0] for r in results) and isinstance(results[0], list), results


def test_eval_windows_of_long_documents_only(tmp_path):
    """min_doc_tokens keeps the split's documents of at least that many tokens: every window's
    tokens come from them, and they are all used (one epoch)."""
    sizes = [30, 3, 55, 12, 80, 7, 41, 2, 19, 33]
    prefix = make_dataset(tmp_path, sizes)
    indexed = MMapIndexedDataset(prefix)
    documents = np.arange(*split_ranges(10, "1,1,0")[1])
    long_docs = [int(d) for d in documents if sizes[d] >= 30]
    assert 0 < len(long_docs) < len(documents)  # the filter has something to drop
    ds = build_eval_windows(prefix, "1,1,0", "valid", 8, seed=3, cache_dir=str(tmp_path / "c"), min_doc_tokens=30)
    assert sorted(int(d) for d in ds.doc_idx) == long_docs
    stream = np.concatenate([indexed[d] for d in long_docs])
    assert len(ds) == (stream.size - 1) // 8
    with pytest.raises(ValueError, match="no document of 1000 tokens or more"):
        build_eval_windows(prefix, "1,1,0", "valid", 8, seed=3, cache_dir=str(tmp_path / "c"), min_doc_tokens=1000)
