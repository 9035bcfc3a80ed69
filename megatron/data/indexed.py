"""The NeoX/Megatron "mmap" indexed dataset: token ids in `<prefix>.bin`, an index in `<prefix>.idx`.

Byte-compatible with GPT-NeoX, so files written here train there and vice versa.

`.idx` layout (all little-endian):

    offset 0   magic  b"MMIDIDX\\x00\\x00"            9 bytes
    offset 9   version = 1                           <Q
    offset 17  dtype code (see DTYPE_CODES)          <B
    offset 18  n = number of items (sequences)       <Q
    offset 26  doc_count = len(doc_idx)              <Q
    offset 34  sizes     int32[n]    tokens per item
               pointers  int64[n]    BYTE offsets of each item in .bin
               doc_idx   int64[doc_count]   item index where each document starts (+ final n)

`.bin` is the items' token ids concatenated, in the dtype named by the code.
We also read the older "TNTIDX" (cached/lazy) index for 1-D items, since it is cheap.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import struct

import numpy as np

from megatron.atomic_io import atomic_output, clean_stale_temporaries, fsync_path, remove_quietly, temp_path
from megatron.data.boundaries import boundary_problem
from megatron.data.identity import check_pair, identity_path, write_identity
from megatron.errors import DataError

_MAGIC = b"MMIDIDX\x00\x00"
_LEGACY_MAGIC = b"TNTIDX\x00\x00"
_VERSION = 1
_HEADER_BYTES = 34  # 9 magic + 8 version + 1 dtype + 8 len + 8 doc_count

DTYPE_CODES = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.int8),
    3: np.dtype(np.int16),
    4: np.dtype(np.int32),
    5: np.dtype(np.int64),
    6: np.dtype(np.float32),
    7: np.dtype(np.float64),
    8: np.dtype(np.uint16),
}
_CODE_OF = {dtype: code for code, dtype in DTYPE_CODES.items()}

_HOW_TO_BUILD = "build it with tools/preprocess_data.py (or tools/prepare_data.py for a bundled corpus)"


class IndexedDatasetError(DataError):
    """A .bin/.idx pair is missing, corrupt or inconsistent."""


def best_dtype(vocab_size: int) -> np.dtype:
    """Smallest token dtype NeoX would pick: uint16 below 65500 ids, else int32."""
    return np.dtype(np.uint16) if vocab_size is not None and vocab_size < 65500 else np.dtype(np.int32)


def idx_path(prefix: str) -> str:
    return prefix + ".idx"


def bin_path(prefix: str) -> str:
    return prefix + ".bin"


def dataset_exists(prefix: str) -> bool:
    return os.path.isfile(idx_path(prefix)) and os.path.isfile(bin_path(prefix))


# ----------------------------------------------------------------------------- writing


def _to_numpy_1d(ids) -> np.ndarray:
    if hasattr(ids, "detach"):  # torch tensor, without importing torch here
        ids = ids.detach().cpu().numpy()
    arr = np.asarray(ids)
    if arr.ndim != 1:
        raise ValueError(f"add_item expects a 1-D sequence of token ids, got shape {arr.shape}; flatten it first")
    return arr


class MMapIndexedDatasetBuilder:
    """Streams items into a temporary .bin; `finalize(idx_path)` validates and publishes the pair.

    Nothing is visible at the final names until finalize() has written both files under
    temporary names and opened them with the full validation of the reader; an empty result is
    refused. Any failure (or abort()) removes the temporaries and leaves an existing dataset
    untouched. An existing dataset is only replaced with overwrite=True (checked here, so a
    long preprocessing run fails at once, and again at publish time).
    """

    def __init__(self, bin_path: str, dtype=np.int64, overwrite: bool = False, tokenizer: dict | None = None):
        """tokenizer: identity.tokenizer_identity() of the tokenizer that wrote the ids, recorded
        in the dataset's identity sidecar (None: the pair is checked, the tokenizer is not)."""
        self._tokenizer = tokenizer
        self._dtype = np.dtype(dtype)
        if self._dtype not in _CODE_OF:
            raise ValueError(f"unsupported token dtype {self._dtype}; use one of {sorted(map(str, _CODE_OF))}")
        self._bin_path = bin_path
        self._overwrite = overwrite
        prefix = _prefix_of(bin_path)
        for path in (bin_path, idx_path(prefix), identity_path(prefix)):  # a SIGKILLed earlier run's temporaries
            clean_stale_temporaries(path)
        refuse_existing(_prefix_of(bin_path), overwrite)
        self._tmp_bin_path = temp_path(bin_path)
        self._data_file = open(self._tmp_bin_path, "wb")  # noqa: SIM115 (stays open until finalize)
        self._sizes: list[int] = []
        self._doc_idx: list[int] = [0]

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()

    def add_item(self, ids) -> None:
        arr = _to_numpy_1d(ids)
        if arr.size and self._dtype.kind in "iu" and arr.dtype.kind in "iu":
            info = np.iinfo(self._dtype)
            if arr.min() < info.min or arr.max() > info.max:
                raise ValueError(
                    f"token id range [{arr.min()}, {arr.max()}] does not fit {self._dtype}; "
                    "build the dataset with a wider dtype (best_dtype(vocab_size))"
                )
        self._data_file.write(arr.astype(self._dtype, copy=False).tobytes(order="C"))
        self._sizes.append(int(arr.size))

    def end_document(self) -> None:
        self._doc_idx.append(len(self._sizes))

    def merge_file_(self, prefix: str) -> None:
        """Append another dataset's items. Like NeoX, its doc_idx is NOT merged into ours."""
        other = MMapIndexedDataset(prefix)
        if other.dtype != self._dtype:
            raise ValueError(f"cannot merge {prefix}: its dtype is {other.dtype}, this builder writes {self._dtype}")
        self._sizes.extend(int(s) for s in other.sizes)
        with open(bin_path(prefix), "rb") as f:
            shutil.copyfileobj(f, self._data_file)

    def abort(self) -> None:
        """Drop everything written so far (the temporaries); an existing dataset stays as it was."""
        self._data_file.close()
        remove_quietly(self._tmp_bin_path)

    def finalize(self, idx_path: str) -> None:
        prefix = _prefix_of(self._bin_path)
        tmp_idx, tmp_identity = temp_path(idx_path), temp_path(identity_path(prefix))
        try:
            self._data_file.close()
            if not self._sizes:
                raise IndexedDatasetError(f"no items were written for {prefix}; nothing was published"
                                          + (" (the existing dataset there is unchanged)" if dataset_exists(prefix) else ""))
            fsync_path(self._tmp_bin_path)
            write_index(tmp_idx, self._dtype, self._sizes, self._doc_idx, atomic=False)
            fsync_path(tmp_idx)
            MMapIndexedDataset.from_paths(tmp_idx, self._tmp_bin_path)  # the reader's full validation
            write_identity(tmp_identity, self._tmp_bin_path, tmp_idx, self._tokenizer)
            refuse_existing(prefix, self._overwrite)
            # Two files cannot be swapped in one step. Readers open the .idx and check it against
            # the .bin, so the order is chosen so that no reader can ever pair files of two
            # builds: drop the old .idx first (a reader now sees "index missing", never the old
            # index over the new .bin), move the new .bin in, and publish the .idx LAST: a
            # dataset is complete exactly when its .idx exists. A crash between the steps leaves
            # a .bin without .idx, which the reader reports as missing (only with overwrite=True,
            # i.e. when the old dataset was meant to go). A reader that opened the old .idx an
            # instant before and the new .bin an instant after holds a mixed pair: its open-time
            # validation (sizes and pointers against the .bin size) refuses it. The identity
            # sidecar goes in just before the .idx, so a complete dataset always has its own.
            remove_quietly(idx_path)
            os.replace(self._tmp_bin_path, self._bin_path)
            os.replace(tmp_identity, identity_path(prefix))
            os.replace(tmp_idx, idx_path)
        except BaseException:
            remove_quietly(tmp_idx)
            remove_quietly(tmp_identity)
            self.abort()
            raise


def _prefix_of(path: str) -> str:
    return path[: -len(".bin")] if path.endswith(".bin") else path


def refuse_existing(prefix: str, overwrite: bool) -> None:
    """Raise unless `prefix` holds no dataset file or the caller asked to replace it."""
    existing = [p for p in (bin_path(prefix), idx_path(prefix)) if os.path.exists(p)]
    if existing and not overwrite:
        raise IndexedDatasetError(
            f"{' and '.join(existing)} already exist(s); refusing to replace a dataset: pass --overwrite "
            "(overwrite=True) to replace it, or choose another output prefix"
        )


def write_index(path: str, dtype, sizes, doc_idx, atomic: bool = True) -> None:
    """Write an MMIDIDX index (atomically: temp file + os.replace, unless the caller publishes it)."""
    dtype = np.dtype(dtype)
    sizes = np.asarray(sizes, dtype=np.int32)
    pointers = np.zeros(len(sizes), dtype=np.int64)
    if len(sizes) > 1:  # byte offset of item i = itemsize * tokens before it
        np.cumsum(sizes[:-1].astype(np.int64) * dtype.itemsize, out=pointers[1:])
    doc_idx = np.asarray(doc_idx, dtype=np.int64)
    with atomic_output(path) if atomic else contextlib.nullcontext(path) as out, open(out, "wb") as f:
        f.write(_MAGIC)
        f.write(struct.pack("<Q", _VERSION))
        f.write(struct.pack("<B", _CODE_OF[dtype]))
        f.write(struct.pack("<Q", len(sizes)))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(sizes.tobytes(order="C"))
        f.write(pointers.tobytes(order="C"))
        f.write(doc_idx.tobytes(order="C"))


# ----------------------------------------------------------------------------- reading


def _dtype_from_code(code: int, path: str) -> np.dtype:
    if code not in DTYPE_CODES:
        raise IndexedDatasetError(f"{path}: unknown dtype code {code} (valid: {sorted(DTYPE_CODES)}); "
                                  "the file is corrupt, rebuild it")
    return DTYPE_CODES[code]


def _require_length(path: str, buf_len: int, expected: int) -> None:
    if buf_len < expected:
        raise IndexedDatasetError(
            f"{path} is truncated: its header implies at least {expected} bytes but the file has {buf_len}; "
            f"delete it and {_HOW_TO_BUILD}"
        )


def _read_mmidx(path: str, buf: np.ndarray):
    """Parse an MMIDIDX index from a uint8 buffer -> (dtype, sizes, pointers, doc_idx)."""
    _require_length(path, len(buf), _HEADER_BYTES)
    (version,) = struct.unpack_from("<Q", buf, 9)
    if version != _VERSION:
        raise IndexedDatasetError(f"{path}: unsupported index version {version} (only {_VERSION}); rebuild it")
    (code,) = struct.unpack_from("<B", buf, 17)
    dtype = _dtype_from_code(code, path)
    n, doc_count = struct.unpack_from("<QQ", buf, 18)
    _require_length(path, len(buf), _HEADER_BYTES + 12 * n + 8 * doc_count)
    sizes = np.frombuffer(buf, dtype=np.int32, count=n, offset=_HEADER_BYTES)
    pointers = np.frombuffer(buf, dtype=np.int64, count=n, offset=_HEADER_BYTES + 4 * n)
    doc_idx = np.frombuffer(buf, dtype=np.int64, count=doc_count, offset=_HEADER_BYTES + 12 * n)
    return dtype, sizes, pointers, doc_idx


def _read_legacy_idx(path: str, buf: np.ndarray):
    """Parse a legacy TNTIDX (cached/lazy) index; only 1-D items (one size per item) are supported."""
    header = 8 + 8 + 16 + 16 + 8
    _require_length(path, len(buf), header)
    (version,) = struct.unpack_from("<Q", buf, 8)
    if version != _VERSION:
        raise IndexedDatasetError(f"{path}: unsupported legacy index version {version}; rebuild it as mmap")
    code, _element_size = struct.unpack_from("<QQ", buf, 16)
    dtype = _dtype_from_code(code, path)
    n, s = struct.unpack_from("<QQ", buf, 32)
    (doc_count,) = struct.unpack_from("<Q", buf, 48)
    _require_length(path, len(buf), header + 8 * (2 * (n + 1) + s + doc_count))
    if s != n:
        raise IndexedDatasetError(f"{path}: legacy index with multi-dimensional items is not supported; rebuild it as mmap")
    arrays = np.frombuffer(buf, dtype=np.int64, count=2 * (n + 1) + s + doc_count, offset=header)
    data_offsets = arrays[n + 1 : 2 * (n + 1)]  # in elements, not bytes
    sizes = arrays[2 * (n + 1) : 2 * (n + 1) + s].astype(np.int32)
    doc_idx = arrays[2 * (n + 1) + s :]
    return dtype, sizes, data_offsets[:-1] * dtype.itemsize, doc_idx


def _memmap_or_empty(path: str) -> np.ndarray:
    # np.memmap refuses zero-length files; an empty dataset is still a valid dataset.
    if os.path.getsize(path) == 0:
        return np.zeros(0, dtype=np.uint8)
    return np.memmap(path, dtype=np.uint8, mode="r", order="C")


_CHUNK = 1 << 20  # items per vectorised step: bounds the temporaries (~20 MB) for any corpus size


def _index_problem(dtype: np.dtype, sizes, pointers, doc_idx, bin_size: int) -> str | None:
    """What is wrong with an index (sizes, byte pointers, doc_idx) over a .bin of bin_size bytes,
    or None. Vectorised in chunks: O(items), about 5 ms per million items.

    Items are stored back to back, so pointers must be the running sum of sizes*itemsize and the
    .bin exactly as long as the last item's end: a wrong dtype code, a .bin from another build, a
    truncated or padded file all break one of these equalities."""
    n, item = len(sizes), dtype.itemsize
    if n and np.min(sizes) < 0:
        return f"item {int(np.argmin(sizes))} has a negative size {int(np.min(sizes))}"
    tokens = int(np.sum(sizes, dtype=np.int64))
    if tokens * item != bin_size:
        return _size_mismatch(dtype, tokens * item, bin_size)
    expected_end = 0  # byte offset where the next item must start
    steps = np.empty(min(n, _CHUNK), dtype=np.int64)  # reused buffers: no page faults per chunk
    starts = np.empty(min(n, _CHUNK) + 1, dtype=np.int64)
    for lo in range(0, n, _CHUNK):
        m = min(_CHUNK, n - lo)
        np.multiply(sizes[lo:lo + m], item, out=steps[:m], dtype=np.int64)
        starts[0] = expected_end
        np.cumsum(steps[:m], out=starts[1:m + 1])
        starts[1:m + 1] += expected_end
        bad = np.asarray(pointers[lo:lo + m]) != starts[:m]
        if bad.any():
            i = int(np.argmax(bad))
            return (f"item {lo + i} starts at byte {int(pointers[lo + i])} but the sizes before it "
                    f"put it at {int(starts[i])}")
        expected_end = int(starts[m])
    if len(doc_idx):
        if int(doc_idx[0]) != 0:
            return f"the document index starts at {int(doc_idx[0])}, not 0"
        for lo in range(0, len(doc_idx), _CHUNK):
            d = np.asarray(doc_idx[lo:lo + _CHUNK + 1])
            down = d[1:] < d[:-1]
            if down.any():
                return f"the document index decreases at entry {lo + int(np.argmax(down)) + 1}"
        if int(doc_idx[-1]) > n:  # non-decreasing from 0: the last entry is the largest
            return f"the document index points past the {n} items (its last entry is {int(doc_idx[-1])})"
    return None


def _size_mismatch(dtype: np.dtype, needed: int, bin_size: int) -> str:
    what = "the .bin is truncated: " if bin_size < needed else ""
    tokens = needed // dtype.itemsize
    hint = ""
    if tokens and bin_size % tokens == 0 and bin_size // tokens in {d.itemsize for d in DTYPE_CODES.values()}:
        hint = f" ({bin_size // tokens} bytes per token: the index's dtype code is wrong for this .bin)"
    return f"{what}the index describes {tokens} {dtype} tokens ({needed} bytes) but the .bin has {bin_size} bytes{hint}"


class MMapIndexedDataset:
    """Read-only view of `<prefix>.bin` + `<prefix>.idx`; items come back as numpy arrays.

    Opening validates the index against the .bin (see _index_problem), so a pair that does not
    belong together is refused with the file names instead of being read as garbage."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self._open(idx_path(prefix), bin_path(prefix))
        if check_pair(prefix, idx_path(prefix), bin_path(prefix)) is None:  # no identity sidecar (identity.py)
            self._check_boundaries()

    def _check_boundaries(self) -> None:
        """Without a sidecar: the index's documents must end on the .bin's end-of-document tokens,
        where it has them (boundaries.py)."""
        if len(self._bin_buf) == 0:
            return
        problem = boundary_problem(self._bin_buf.view(self._dtype), self._sizes, self._pointers, self._doc_idx)
        if problem:
            raise IndexedDatasetError(
                f"{idx_path(self.prefix)} does not fit {bin_path(self.prefix)}: {problem}; there is no "
                f"{os.path.basename(identity_path(self.prefix))} beside them to tell which .idx belongs to the .bin. "
                f"Restore the .idx written with this .bin, or delete both files and {_HOW_TO_BUILD}")

    @classmethod
    def from_paths(cls, index_file: str, data_file: str) -> MMapIndexedDataset:
        """Open an explicit (.idx, .bin) pair, e.g. temporaries about to be published."""
        self = cls.__new__(cls)
        self.prefix = _prefix_of(data_file)
        self._open(index_file, data_file)
        return self

    def _open(self, ipath: str, bpath: str, full: bool = True) -> None:
        for path in (ipath, bpath):
            if not os.path.isfile(path):
                raise IndexedDatasetError(f"data file {path} does not exist; check data-path, or {_HOW_TO_BUILD}")
        self._index_buf = _memmap_or_empty(ipath)
        magic = bytes(self._index_buf[:9])
        if magic == _MAGIC:
            parsed = _read_mmidx(ipath, self._index_buf)
        elif magic[:8] == _LEGACY_MAGIC:
            parsed = _read_legacy_idx(ipath, self._index_buf)
        else:
            raise IndexedDatasetError(f"{ipath}: bad magic {magic!r}, this is not a Megatron/NeoX index file; {_HOW_TO_BUILD}")
        self._dtype, self._sizes, self._pointers, self._doc_idx = parsed
        self._bin_buf = _memmap_or_empty(bpath)
        if not full:  # the header, and the last item ending exactly at the end of the .bin: O(1)
            needed = int(self._pointers[-1]) + int(self._sizes[-1]) * self._dtype.itemsize if len(self._sizes) else 0
            problem = _size_mismatch(self._dtype, needed, len(self._bin_buf)) if needed != len(self._bin_buf) else None
        else:
            problem = _index_problem(self._dtype, self._sizes, self._pointers, self._doc_idx, len(self._bin_buf))
        if problem:
            raise IndexedDatasetError(f"{ipath} does not match {bpath}: {problem}; the pair is corrupt or comes "
                                      f"from two different builds: delete both files and {_HOW_TO_BUILD}")

    @classmethod
    def check_files(cls, prefix: str) -> None:
        """Raise IndexedDatasetError unless `prefix` has both files, a valid index header, and an
        index whose last item ends exactly at the end of the .bin. O(1), for fail-fast checks
        (config validation, --dry-run); opening the dataset does the full check."""
        cls.__new__(cls)._open(idx_path(prefix), bin_path(prefix), full=False)

    def __len__(self) -> int:
        return len(self._sizes)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self.get(j) for j in range(*i.indices(len(self)))]
        return self.get(i)

    def get(self, i: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens [offset, offset+length) of item i (offset/length in tokens, not bytes)."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"item {i} out of range for dataset of {n} items")
        size = int(self._sizes[i])
        if length is None:
            length = size - offset
        assert 0 <= offset and offset + length <= size, (i, offset, length, size)
        start = int(self._pointers[i]) + offset * self._dtype.itemsize
        return np.frombuffer(self._bin_buf, dtype=self._dtype, count=length, offset=start)

    @property
    def sizes(self) -> np.ndarray:
        return self._sizes

    @property
    def pointers(self) -> np.ndarray:
        return self._pointers

    @property
    def doc_idx(self) -> np.ndarray:
        return self._doc_idx

    @property
    def dtype(self) -> np.dtype:
        return self._dtype
