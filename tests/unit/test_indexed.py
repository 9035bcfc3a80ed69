"""MMIDIDX reader/writer: byte-exact NeoX format and clear errors on broken files."""
import struct

import numpy as np
import pytest
import torch

from megatron.data.indexed import (
    IndexedDatasetError,
    MMapIndexedDataset,
    MMapIndexedDatasetBuilder,
    best_dtype,
    dataset_exists,
)


def build(prefix, docs, dtype=np.uint16):
    b = MMapIndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for d in docs:
        b.add_item(d)
        b.end_document()
    b.finalize(f"{prefix}.idx")


def test_best_dtype():
    assert best_dtype(50257) == np.uint16
    assert best_dtype(65499) == np.uint16
    assert best_dtype(65500) == np.int32


def test_round_trip_list_numpy_torch(tmp_path):
    prefix = str(tmp_path / "ds")
    docs = [[1, 2, 3], np.array([7], dtype=np.int64), torch.tensor([4, 5, 6, 7, 8]), []]
    build(prefix, docs)
    assert dataset_exists(prefix)
    ds = MMapIndexedDataset(prefix)
    assert len(ds) == 4 and ds.dtype == np.uint16
    assert ds.sizes.dtype == np.int32 and ds.sizes.tolist() == [3, 1, 5, 0]
    assert ds.pointers.tolist() == [0, 6, 8, 18]  # byte offsets, 2 bytes per token
    assert ds.doc_idx.tolist() == [0, 1, 2, 3, 4]
    assert ds[2].tolist() == [4, 5, 6, 7, 8]
    assert ds.get(2, offset=1, length=3).tolist() == [5, 6, 7]
    assert ds.get(2, offset=3).tolist() == [7, 8]
    assert ds[3].tolist() == [] and [x.tolist() for x in ds[0:2]] == [[1, 2, 3], [7]]


def test_idx_bytes_match_hand_built_struct(tmp_path):
    prefix = str(tmp_path / "ds")
    build(prefix, [[10, 11], [12, 13, 14]], dtype=np.uint16)
    expected = b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8) + struct.pack("<Q", 2) + struct.pack("<Q", 3)
    expected += struct.pack("<2i", 2, 3) + struct.pack("<2q", 0, 4) + struct.pack("<3q", 0, 1, 2)
    assert (tmp_path / "ds.idx").read_bytes() == expected
    assert (tmp_path / "ds.bin").read_bytes() == struct.pack("<5H", 10, 11, 12, 13, 14)
    assert not list(tmp_path.glob("*.tmp"))


def test_merge_file(tmp_path):
    build(str(tmp_path / "a"), [[1, 2], [3]])
    build(str(tmp_path / "b"), [[4, 5, 6]])
    b = MMapIndexedDatasetBuilder(str(tmp_path / "m.bin"), dtype=np.uint16)
    b.merge_file_(str(tmp_path / "a"))
    b.merge_file_(str(tmp_path / "b"))
    b.finalize(str(tmp_path / "m.idx"))
    ds = MMapIndexedDataset(str(tmp_path / "m"))
    assert [x.tolist() for x in ds[0:3]] == [[1, 2], [3], [4, 5, 6]]


def test_token_out_of_dtype_range(tmp_path):
    b = MMapIndexedDatasetBuilder(str(tmp_path / "x.bin"), dtype=np.uint16)
    with pytest.raises(ValueError, match="does not fit"):
        b.add_item([70000])


def test_legacy_tntidx(tmp_path):
    sizes, data = [2, 3], np.array([1, 2, 3, 4, 5], dtype=np.int32)
    header = b"TNTIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<QQ", 4, 4) + struct.pack("<QQ", 2, 2) + struct.pack("<Q", 3)
    arrays = np.array([0, 1, 2] + [0, 2, 5] + sizes + [0, 1, 2], dtype=np.int64)
    (tmp_path / "old.idx").write_bytes(header + arrays.tobytes())
    (tmp_path / "old.bin").write_bytes(data.tobytes())
    ds = MMapIndexedDataset(str(tmp_path / "old"))
    assert ds.dtype == np.int32 and ds[1].tolist() == [3, 4, 5]


def test_truncated_idx_names_lengths(tmp_path):
    prefix = str(tmp_path / "ds")
    build(prefix, [[1, 2, 3]] * 4)
    full = (tmp_path / "ds.idx").read_bytes()
    (tmp_path / "ds.idx").write_bytes(full[:-5])
    with pytest.raises(IndexedDatasetError, match=rf"truncated.*{len(full)} bytes.*has {len(full) - 5}"):
        MMapIndexedDataset(prefix)


def test_truncated_bin(tmp_path):
    prefix = str(tmp_path / "ds")
    build(prefix, [[1, 2, 3]] * 4)
    (tmp_path / "ds.bin").write_bytes((tmp_path / "ds.bin").read_bytes()[:10])
    with pytest.raises(IndexedDatasetError, match=r"ds\.bin is truncated.*24 bytes.*has 10"):
        MMapIndexedDataset(prefix)


def test_bad_magic_version_dtype(tmp_path):
    prefix = str(tmp_path / "ds")
    build(prefix, [[1, 2, 3]])
    good = (tmp_path / "ds.idx").read_bytes()
    (tmp_path / "ds.idx").write_bytes(b"NOTANIDX!" + good[9:])
    with pytest.raises(IndexedDatasetError, match="bad magic"):
        MMapIndexedDataset(prefix)
    (tmp_path / "ds.idx").write_bytes(good[:9] + struct.pack("<Q", 2) + good[17:])
    with pytest.raises(IndexedDatasetError, match="version 2"):
        MMapIndexedDataset(prefix)
    (tmp_path / "ds.idx").write_bytes(good[:17] + b"\x09" + good[18:])
    with pytest.raises(IndexedDatasetError, match="dtype code 9"):
        MMapIndexedDataset(prefix)


@pytest.mark.parametrize("missing", ["idx", "bin"])
def test_missing_file_says_which(tmp_path, missing):
    prefix = str(tmp_path / "ds")
    build(prefix, [[1]])
    (tmp_path / f"ds.{missing}").unlink()
    assert not dataset_exists(prefix)
    with pytest.raises(IndexedDatasetError, match=rf"ds\.{missing} does not exist.*preprocess_data\.py"):
        MMapIndexedDataset(prefix)


def test_crash_before_finalize_leaves_no_dataset(tmp_path):
    prefix = str(tmp_path / "ds")
    build(prefix, [[1, 2]])
    b = MMapIndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    b.add_item([9, 9, 9])  # "crash" here: the old pair must still be intact and consistent
    assert MMapIndexedDataset(prefix)[0].tolist() == [1, 2]
