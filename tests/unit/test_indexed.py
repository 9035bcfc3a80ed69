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


def build(prefix, docs, dtype=np.uint16, overwrite=False):
    b = MMapIndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype, overwrite=overwrite)
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
    with pytest.raises(IndexedDatasetError, match=r"ds\.bin: the \.bin is truncated.*24 bytes.*has 10"):
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
    b = MMapIndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16, overwrite=True)
    b.add_item([9, 9, 9])  # "crash" here: the old pair must still be intact and consistent
    assert MMapIndexedDataset(prefix)[0].tolist() == [1, 2]


# ------------------------------------------------------------------- the index must match the .bin

HEADER = 34  # magic 9 + version 8 + dtype 1 + n 8 + doc_count 8


def patch(path, offset, data):
    raw = bytearray(path.read_bytes())
    raw[offset:offset + len(data)] = data
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("code,match", [
    (4, r"the \.bin is truncated: the index describes 9 int32 tokens \(36 bytes\) but the \.bin has 18 bytes "
        r"\(2 bytes per token: the index's dtype code is wrong"),
    (1, r"the index describes 9 uint8 tokens \(9 bytes\) but the \.bin has 18 bytes \(2 bytes per token"),
    (3, r"item 1 starts at byte 4 but the sizes before it put it at 6"),  # int16: same itemsize, so the
])                                                                      # sizes still agree; code 3 vs uint16
def test_wrong_dtype_code_is_refused(tmp_path, code, match):
    prefix = str(tmp_path / "ds")
    build(prefix, [[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    patch(tmp_path / "ds.idx", 17, bytes([code]))
    if code == 3:  # int16 has the uint16 item size: make the pointers disagree too, as a corrupt file would
        patch(tmp_path / "ds.idx", HEADER + 12 + 8, struct.pack("<q", 4))
    with pytest.raises(IndexedDatasetError, match=rf"ds\.idx does not match .*ds\.bin: {match}.*delete both files"):
        MMapIndexedDataset(prefix)


def test_sizes_pointers_doc_idx_checked_against_bin(tmp_path):
    prefix = str(tmp_path / "ds")
    build(prefix, [[1, 2, 3], [4, 5], [6]])  # n=3, sizes at 34, pointers at 46, doc_idx at 70
    good = (tmp_path / "ds.idx").read_bytes()
    cases = [
        (HEADER + 4, struct.pack("<i", 3),
         r"the \.bin is truncated: the index describes 7 uint16 tokens \(14 bytes\) but the \.bin has 12 bytes;"),
        (HEADER, struct.pack("<2i", 2, 3), r"item 1 starts at byte 6 but the sizes before it put it at 4"),
        (HEADER + 8, struct.pack("<i", -1), r"item 2 has a negative size -1"),
        (HEADER + 12 + 16, struct.pack("<q", 11), r"item 2 starts at byte 11 but the sizes before it put it at 10"),
        (HEADER + 36, struct.pack("<q", 1), r"the document index starts at 1, not 0"),
        (HEADER + 36 + 16, struct.pack("<q", 0), r"the document index decreases at entry 2"),
        (HEADER + 36 + 24, struct.pack("<q", 4), r"the document index points past the 3 items \(its last entry is 4\)"),
    ]
    for offset, data, match in cases:
        (tmp_path / "ds.idx").write_bytes(good)
        patch(tmp_path / "ds.idx", offset, data)
        with pytest.raises(IndexedDatasetError, match=r"ds\.idx does not match .*ds\.bin: " + match):
            MMapIndexedDataset(prefix)
    (tmp_path / "ds.idx").write_bytes(good)
    (tmp_path / "ds.bin").write_bytes((tmp_path / "ds.bin").read_bytes() + b"\0\0")  # a .bin from another build
    with pytest.raises(IndexedDatasetError, match=r"describes 6 uint16 tokens \(12 bytes\) but the \.bin has 14"):
        MMapIndexedDataset(prefix)


def test_check_files_is_the_cheap_header_check(tmp_path):
    prefix = str(tmp_path / "ds")
    build(prefix, [[1, 2, 3], [4, 5]])
    MMapIndexedDataset.check_files(prefix)
    patch(tmp_path / "ds.idx", 17, bytes([4]))  # int32: the last item now ends past the .bin
    with pytest.raises(IndexedDatasetError, match=r"ds\.idx does not match.*truncated"):
        MMapIndexedDataset.check_files(prefix)
    (tmp_path / "ds.bin").unlink()
    with pytest.raises(IndexedDatasetError, match=r"ds\.bin does not exist"):
        MMapIndexedDataset.check_files(prefix)


# ------------------------------------------------------------------- publishing


def test_existing_dataset_is_not_replaced_without_overwrite(tmp_path):
    prefix = str(tmp_path / "ds")
    build(prefix, [[1, 2]])
    with pytest.raises(IndexedDatasetError, match=r"ds\.bin and .*ds\.idx already exist.*--overwrite"):
        build(prefix, [[7]])
    assert MMapIndexedDataset(prefix)[0].tolist() == [1, 2]
    build(prefix, [[7]], overwrite=True)
    assert MMapIndexedDataset(prefix)[0].tolist() == [7]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds.bin", "ds.identity.json", "ds.idx"]  # no temporaries


def test_empty_result_is_not_published_and_leaves_no_temporaries(tmp_path):
    prefix = str(tmp_path / "ds")
    build(prefix, [[1, 2]])
    with pytest.raises(IndexedDatasetError, match=r"no items were written.*existing dataset there is unchanged"):
        build(prefix, [], overwrite=True)
    assert MMapIndexedDataset(prefix)[0].tolist() == [1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds.bin", "ds.identity.json", "ds.idx"]  # no temporaries


def test_failure_inside_the_builder_removes_temporaries(tmp_path):
    prefix = str(tmp_path / "ds")
    with pytest.raises(ValueError, match="does not fit"), MMapIndexedDatasetBuilder(f"{prefix}.bin", np.uint16) as b:
        b.add_item([1, 2])
        b.add_item([70000])
    assert list(tmp_path.iterdir()) == []
