"""GPT-NeoX's GPT2Dataset: fixed-length training samples cut from a shuffled stream of documents.

Three index arrays, built once and cached as .npy (NeoX layout and RNG order, so the same seed
yields the same samples as NeoX):

    doc_idx      [E*D] int32      the split's documents tiled over E epochs, shuffled jointly
    sample_idx   [n+1, 2]         row k = (position in doc_idx, token offset) where sample k starts
    shuffle_idx  [n]              the order in which samples are served

Sample k is the tokens from row k to row k+1 INCLUSIVE, i.e. seq_length+1 tokens; consecutive
samples share one boundary token, so as (input = x[:-1], target = x[1:]) pairs every token of
the stream after the first is predicted exactly once per epoch.

NeoX builds sample_idx with a C++ loop; we get the identical array from cumsum + searchsorted.

The cache keeps NeoX's file names and adds `<stem>_key.json`, a hash of the documents' sizes the
maps were built from (maps_key): maps for other data, or torn/corrupt files, are rebuilt.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import time

import numpy as np
import torch

from megatron.atomic_io import atomic_output, remove_quietly
from megatron.data.indexed import MMapIndexedDataset, bin_path
from megatron.errors import DataError

SPLIT_NAMES = ("train", "valid", "test")


class SampleError(DataError):
    """A bad sample, raised in __getitem__, which may run in a DataLoader worker process (torch
    re-raises it in the trainer with the worker's traceback in the message; the top-level handler,
    megatron.errors.worker_message, prints only the original line)."""

# Where index maps go when the data directory is read-only (relative to the current run's cwd).
FALLBACK_CACHE_DIR = os.path.join("cache", "index_maps")


def split_ranges(num_items: int, split: str) -> list[tuple[int, int]]:
    """NeoX train/valid/test split of `num_items` documents, e.g. split="949,50,1".

    Each proportion is rounded separately (round(frac*N)), then every boundary is shifted so the
    last one is exactly N (NeoX's `get_train_valid_test_split_`).
    """
    sep = "," if "," in split else ("/" if "/" in split else None)
    try:
        parts = [float(s) for s in (split.split(sep) if sep else [split])]
    except ValueError:
        parts = None
    if not parts or len(parts) > 3 or any(p < 0 for p in parts) or sum(parts) <= 0:
        raise ValueError(f"bad split {split!r}: give up to 3 non-negative weights for train,valid,test, e.g. '949,50,1'")
    parts = (parts + [0.0, 0.0])[:3]
    total = sum(parts)
    bounds = [0]
    for p in parts:
        bounds.append(bounds[-1] + round(p / total * num_items))
    diff = bounds[-1] - num_items
    bounds = [bounds[0]] + [min(max(b - diff, 0), num_items) for b in bounds[1:]]
    return [(bounds[i], bounds[i + 1]) for i in range(3)]


def num_epochs_needed(tokens_per_epoch: int, seq_length: int, num_samples: int) -> int:
    """Smallest E with (E*tokens_per_epoch - 1) // seq_length >= num_samples."""
    epochs = 1
    while (epochs * tokens_per_epoch - 1) // seq_length < num_samples:
        epochs += 1
    return epochs


def build_doc_idx(documents: np.ndarray, num_epochs: int, np_rng: np.random.RandomState, shuffle: bool = True) -> np.ndarray:
    """Documents tiled num_epochs times, then shuffled as one array (epochs mix at their borders)."""
    doc_idx = np.tile(np.asarray(documents), num_epochs).astype(np.int32)
    if shuffle:
        np_rng.shuffle(doc_idx)
    return doc_idx


def build_sample_idx(sizes: np.ndarray, doc_idx: np.ndarray, seq_length: int, num_epochs: int,
                     tokens_per_epoch: int) -> np.ndarray:
    """Start of every sample as (position in doc_idx, token offset); see the module docstring.

    Sample k starts at stream token k*seq_length. A start that falls on the last token of a
    document stays in that document (NeoX semantics), which is what searchsorted(side="right")
    on the document end positions gives; empty documents are skipped the same way.
    """
    num_samples = (num_epochs * tokens_per_epoch - 1) // seq_length
    doc_sizes = np.asarray(sizes)[doc_idx].astype(np.int64)
    doc_ends = np.cumsum(doc_sizes)  # stream position one past each document
    starts = np.arange(num_samples + 1, dtype=np.int64) * seq_length
    doc_pos = np.searchsorted(doc_ends, starts, side="right")
    offsets = starts - (doc_ends[doc_pos] - doc_sizes[doc_pos])
    doc_pos[0], offsets[0] = 0, 0  # NeoX pins the first row to (0, 0) even if doc 0 is empty
    big = max(len(doc_idx), int(doc_sizes.max(initial=0))) > np.iinfo(np.int32).max
    sample_idx = np.stack([doc_pos, offsets], axis=1)
    return sample_idx.astype(np.int64 if big else np.int32)


def build_shuffle_idx(size: int, np_rng: np.random.RandomState, shuffle: bool = True) -> np.ndarray:
    dtype = np.uint32 if size < np.iinfo(np.uint32).max - 1 else np.int64
    shuffle_idx = np.arange(size, dtype=dtype)
    if shuffle:
        np_rng.shuffle(shuffle_idx)
    return shuffle_idx


def _save_npy_atomic(path: str, arr: np.ndarray) -> None:
    with atomic_output(path) as tmp, open(tmp, "wb") as f:  # a file object stops np.save from appending ".npy"
        np.save(f, arr, allow_pickle=False)


def maps_key(indexed_dataset, documents: np.ndarray) -> str:
    """Identity of the data the index maps are computed from, for the cache.

    The maps are a function of the numbers in their file name (samples, seq_length, seed) and of
    the token counts of the split's documents, nothing else. So the key is a hash of exactly
    those counts (and the document ids), read from the .idx: unlike size+mtime it survives a copy
    of the data (no needless rebuild) and catches a rewrite that keeps the size, the same document
    and token totals, or an old mtime (tar, rsync -t), and a .bin rewritten with the same sizes
    rightly keeps its maps. Cost: one pass over 4 bytes per document (~10 ms per million)."""
    documents, sizes = np.asarray(documents), np.asarray(indexed_dataset.sizes)
    h = hashlib.blake2b(digest_size=16)
    first = int(documents[0]) if documents.size else 0
    if documents.size and int(documents[-1]) - first + 1 == documents.size and (np.diff(documents) == 1).all():
        h.update(f"range {first} {documents.size}".encode())  # a split is a range: hash the sizes in place
        h.update(np.ascontiguousarray(sizes[first:first + documents.size], dtype=np.int32).data)
    else:
        h.update(np.ascontiguousarray(documents, dtype=np.int64).data)
        h.update(np.ascontiguousarray(sizes[documents], dtype=np.int32).data)
    return h.hexdigest()


def _load_maps(paths: dict, key: str | None, rows: dict) -> dict | None:
    """The three cached maps, memory-mapped, if they were built for `key` (None: do not check)
    and have the expected shapes, else None (missing, built for other data, or torn/corrupt: the
    caller rebuilds)."""
    try:
        if key is not None:
            with open(paths["key"]) as f:
                if json.load(f).get("key") != key:
                    return None
        maps = {kind: np.load(paths[kind], mmap_mode="r", allow_pickle=False) for kind in rows}
    except (OSError, ValueError, EOFError, AttributeError):  # missing, not JSON / not .npy, truncated
        return None
    ok = all(maps[k].shape[:1] == (rows[k],) and maps[k].dtype.kind in "iu" for k in rows)
    return maps if ok and maps["sample"].ndim == 2 and maps["sample"].shape[1] == 2 else None


@contextlib.contextmanager
def _building_maps(directory: str):
    """One process at a time builds index maps in `directory`: the ranks of a run (and runs sharing
    a data directory) start together on a fresh cache; without it each rank built the same maps,
    and one could find another's half-written set and call it "damaged". flock on the directory
    itself, so no lock file is left beside the data; released when the process dies."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _writable_cache_dir(cache_dir: str | None, data_prefix: str) -> str:
    """cache_dir if given, else the data's own directory, else FALLBACK_CACHE_DIR under the cwd."""
    if cache_dir is not None:
        os.makedirs(cache_dir, exist_ok=True)
        return cache_dir
    data_dir = os.path.dirname(os.path.abspath(data_prefix))
    if os.access(data_dir, os.W_OK):
        return data_dir
    os.makedirs(FALLBACK_CACHE_DIR, exist_ok=True)
    return FALLBACK_CACHE_DIR


def _index_map_paths(directory: str, data_prefix: str, name: str, num_samples: int, seq_length: int, seed: int, shuffle: bool):
    # NeoX (KERPLE-era) file names, so caches made by either stack are interchangeable.
    stem = f"{os.path.basename(data_prefix)}_{name}_indexmap_{num_samples}ns_{seq_length}sl_{seed}s"
    if not shuffle:
        stem += "_noshuffle"  # must never collide with the shuffled maps
    paths = {kind: os.path.join(directory, f"{stem}_{kind}_idx.npy") for kind in ("doc", "sample", "shuffle")}
    paths["key"] = os.path.join(directory, f"{stem}_key.json")  # ours: which data the maps belong to
    return paths


class GPTDataset(torch.utils.data.Dataset):
    """Samples of seq_length+1 tokens from the documents `documents` of `indexed_dataset`.

    num_samples=None means exactly one epoch (all full windows), as used for evaluation.
    max_samples truncates the dataset to its first max_samples samples in served order.
    Index maps are cached in cache_dir (default: next to the data; if that directory is not
    writable, FALLBACK_CACHE_DIR under the current working directory) and memory-mapped.
    vocab_size: samples holding token ids outside [0, vocab_size) raise a DataError (None: unchecked).
    """

    def __init__(self, name, data_prefix, documents: np.ndarray, indexed_dataset, num_samples, seq_length, seed,
                 cache_dir=None, shuffle=True, max_samples=None, stream_order=False, vocab_size=None):
        self.name, self.indexed_dataset, self.seq_length = name, indexed_dataset, seq_length
        self.data_prefix, self.vocab_size = data_prefix, vocab_size
        documents = np.asarray(documents)
        assert documents.size == 0 or (documents.min() >= 0 and documents.max() < len(indexed_dataset))
        tokens_per_epoch = int(np.sum(indexed_dataset.sizes[documents], dtype=np.int64))
        if tokens_per_epoch < seq_length + 1:
            raise DataError(
                f"the {name} split of {data_prefix} has {len(documents)} documents and {tokens_per_epoch} tokens, "
                f"but one sample needs seq_length+1 = {seq_length + 1} tokens; use more data, a shorter "
                f"sequence length, or a split that gives {name} a bigger share"
            )
        if num_samples is None:  # one epoch: every full window once
            num_samples = (tokens_per_epoch - 1) // seq_length
        num_epochs = num_epochs_needed(tokens_per_epoch, seq_length, num_samples)
        rows = {"doc": num_epochs * len(documents), "sample": (num_epochs * tokens_per_epoch - 1) // seq_length + 1}
        rows["shuffle"] = rows["sample"] - 1
        maps = self._find_or_build(data_prefix, documents, num_samples, num_epochs, tokens_per_epoch, seed, cache_dir,
                                   shuffle, rows)
        self.doc_idx, self.sample_idx, self.shuffle_idx = maps["doc"], maps["sample"], maps["shuffle"]
        self.num_samples, self.num_epochs, self.tokens_per_epoch = num_samples, num_epochs, tokens_per_epoch
        self._len = self.sample_idx.shape[0] - 1
        # stream_order serves windows in document-stream order (ignoring shuffle_idx), so that a
        # truncated evaluation at any length covers the same leading tokens of the split.
        self.stream_order = stream_order
        if max_samples is not None:
            self._len = min(self._len, int(max_samples))

    def _find_or_build(self, data_prefix, documents, num_samples, num_epochs, tokens_per_epoch, seed, cache_dir,
                       shuffle, rows):
        names = (data_prefix, self.name, num_samples, self.seq_length, seed, shuffle)
        key = maps_key(self.indexed_dataset, documents)
        paths = _index_map_paths(_writable_cache_dir(cache_dir, data_prefix), *names)
        candidates = [paths]
        if cache_dir is None:  # maps already next to the data (maybe read-only) are reused as they are
            candidates.insert(0, _index_map_paths(os.path.dirname(os.path.abspath(data_prefix)), *names))
        for found in candidates:
            maps = _load_maps(found, key, rows)
            if maps is not None:
                return maps
        with _building_maps(os.path.dirname(paths["doc"])):
            maps = _load_maps(paths, key, rows)  # another process (a rank of this run) built them meanwhile
            return maps if maps is not None else self._build(data_prefix, documents, num_epochs, tokens_per_epoch,
                                                             seed, shuffle, paths, key, rows)

    def _build(self, data_prefix, documents, num_epochs, tokens_per_epoch, seed, shuffle, paths, key, rows):
        if os.path.exists(paths["doc"]):
            print(f" > cached {self.name} index maps {paths['doc']} (and _sample/_shuffle) were built for other data, "
                  f"have no _key.json (made by another tool) or are damaged; rebuilding them for {data_prefix}", flush=True)
        t0 = time.time()
        np_rng = np.random.RandomState(seed=seed)  # consumed in NeoX's order: doc, then shuffle
        doc_idx = build_doc_idx(documents, num_epochs, np_rng, shuffle)
        sample_idx = build_sample_idx(self.indexed_dataset.sizes, doc_idx, self.seq_length, num_epochs, tokens_per_epoch)
        shuffle_idx = build_shuffle_idx(sample_idx.shape[0] - 1, np_rng, shuffle)
        # The key goes first and last: removed before the maps change, so no reader pairs it with
        # maps of other data, and written (atomically, like each map) once all three are in place.
        remove_quietly(paths["key"])
        for kind, arr in (("doc", doc_idx), ("sample", sample_idx), ("shuffle", shuffle_idx)):
            _save_npy_atomic(paths[kind], arr)
        with atomic_output(paths["key"]) as tmp, open(tmp, "w") as f:
            json.dump({"key": key, "data": os.path.abspath(data_prefix)}, f)
        print(f" > built {self.name} index maps: {num_epochs} epoch(s), {shuffle_idx.size} samples "
              f"in {time.time() - t0:.2f}s -> {os.path.dirname(paths['doc'])}", flush=True)
        # Memory-mapped like cached maps (written under _building_maps, so no one is rewriting them).
        return _load_maps(paths, None, rows) or {"doc": doc_idx, "sample": sample_idx, "shuffle": shuffle_idx}

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < self._len:
            raise IndexError(f"sample {i} out of range for {self.name} dataset of {self._len} samples")
        j = i if self.stream_order else int(self.shuffle_idx[i])
        doc_f, off_f = (int(x) for x in self.sample_idx[j])
        doc_l, off_l = (int(x) for x in self.sample_idx[j + 1])
        get = self.indexed_dataset.get
        if doc_f == doc_l:
            sample = get(int(self.doc_idx[doc_f]), offset=off_f, length=off_l - off_f + 1)
        else:  # tail of the first doc, whole middle docs, head of the last doc (inclusive)
            pieces = [get(int(self.doc_idx[doc_f]), offset=off_f)]
            pieces += [get(int(self.doc_idx[d])) for d in range(doc_f + 1, doc_l)]
            pieces.append(get(int(self.doc_idx[doc_l]), length=off_l + 1))
            sample = np.concatenate(pieces)
        assert sample.shape[0] == self.seq_length + 1, (sample.shape, self.seq_length)
        if self.vocab_size is not None:
            self._check_vocab(sample, i)
        return {"text": np.array(sample, dtype=np.int64)}

    def _check_vocab(self, sample: np.ndarray, i: int) -> None:
        """Token ids outside [0, vocab_size) mean the data was built with another tokenizer; the
        embedding would fail with a bare IndexError (or, below the padded size, silently train on
        rows no token maps to). Per sample, since the cost (a min/max over seq_length+1 ids,
        ~2 us) is paid only for what is read, at any corpus size."""
        lo, hi = int(sample.min()), int(sample.max())
        if lo < 0 or hi >= self.vocab_size:
            bad = hi if hi >= self.vocab_size else lo
            raise SampleError(f"{bin_path(self.data_prefix)}: {self.name} sample {i} holds token id {bad}, outside the "
                            f"vocabulary of {self.vocab_size} ids: the data was tokenized with another tokenizer; "
                            "rebuild it with tools/preprocess_data.py and this model's tokenizer (vocab-file), or "
                            "set vocab-file/tokenizer-type to the ones it was built with")


def _split_documents(indexed: MMapIndexedDataset, split: str, split_name: str) -> np.ndarray:
    start, end = split_ranges(len(indexed), split)[SPLIT_NAMES.index(split_name)]
    return np.arange(start, end, dtype=np.int32)


def build_train_valid_test_datasets(data_prefix, split, seq_length, seed, num_samples=(0, 0, 0),
                                    seq_length_val=None, cache_dir=None, vocab_size=None):
    """(train, valid, test) GPTDatasets; None where num_samples is 0. num_samples entries may be
    None for one epoch. valid/test use seq_length_val when given (KERPLE trains short, evaluates long)."""
    if len(num_samples) != 3:
        raise ValueError(f"num_samples must be (train, valid, test), got {num_samples!r}")
    indexed = MMapIndexedDataset(data_prefix)
    datasets = []
    for name, n in zip(SPLIT_NAMES, num_samples):
        if n == 0:
            datasets.append(None)
            continue
        length = seq_length if name == "train" or seq_length_val is None else seq_length_val
        documents = _split_documents(indexed, split, name)
        datasets.append(GPTDataset(name, data_prefix, documents, indexed, n, length, seed, cache_dir=cache_dir,
                                   vocab_size=vocab_size))
    return tuple(datasets)


def build_eval_windows(data_prefix, split, split_name, seq_length, seed, max_windows=None, cache_dir=None,
                       stream_order=True, vocab_size=None, min_doc_tokens: int | None = None) -> GPTDataset:
    """One epoch of the split's shuffled document stream cut into windows of seq_length+1 tokens
    (neighbours share one boundary token, so targets never overlap), truncated to the first
    max_windows. This is the KERPLE paper's evaluation at any length.

    The document order is the seeded NeoX shuffle (the same at every length). By default the
    windows are served in stream order, so N windows of length L cover the same leading N*L
    tokens at every L and a truncated sweep compares lengths on the same text; with
    stream_order=False they come in NeoX's shuffled sample order, as the paper's runs did
    (identical when the whole epoch is evaluated). min_doc_tokens: keep only the split's documents
    of at least that many tokens (a corpus's long documents alone)."""
    if split_name not in ("valid", "test"):
        raise ValueError(f"split_name must be 'valid' or 'test', got {split_name!r}")
    indexed = MMapIndexedDataset(data_prefix)
    documents = _split_documents(indexed, split, split_name)
    if min_doc_tokens:
        documents = documents[indexed.sizes[documents] >= min_doc_tokens]
        if documents.size == 0:
            raise ValueError(f"{data_prefix}: the {split_name} split has no document of {min_doc_tokens} tokens or more")
    return GPTDataset(split_name, data_prefix, documents, indexed, None, seq_length, seed,
                      cache_dir=cache_dir, max_samples=max_windows, stream_order=stream_order, vocab_size=vocab_size)
