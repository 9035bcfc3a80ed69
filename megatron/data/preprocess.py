"""Documents (jsonl, jsonl.zst, txt, ... via lm_dataformat) -> tokenized MMIDIDX dataset.

The reusable core of tools/preprocess_data.py: each non-empty document becomes one item
(+ end_document) in `<output_prefix>_<key>_document.{bin,idx}`, NeoX's layout.
"""
from __future__ import annotations

import itertools
import multiprocessing
import os
import threading
import time

import numpy as np

from megatron.data.indexed import (
    MMapIndexedDatasetBuilder,
    best_dtype,
    bin_path,
    idx_path,
)

_BATCH = 256  # documents per tokenize_batch call in the single-process path


def output_prefix_for(output_prefix: str, key: str = "text") -> str:
    return f"{output_prefix}_{key}_document"


def _check_inputs(inputs) -> list[str]:
    if isinstance(inputs, str):
        inputs = inputs.split(",")
    inputs = [p.strip() for p in inputs if p.strip()]
    if not inputs:
        raise ValueError("no input given; pass --input file1.jsonl.zst,dir2,...")
    for path in inputs:
        if not os.path.exists(path):
            raise ValueError(f"input {path!r} does not exist; pass existing files or directories to --input")
    return inputs


def iter_documents(inputs: list[str], num_docs: int | None = None):
    """Non-empty document texts from every input, in order (the text always comes from "text", as in NeoX)."""
    import lm_dataformat  # imported lazily: it pulls jsonlines/ujson, only needed here

    def gen():
        for path in inputs:
            try:
                yield from (doc for doc in lm_dataformat.Reader(path).stream_data() if doc)
            except FileNotFoundError as e:
                raise ValueError(f"input {path!r} has no readable files ({e}); lm_dataformat reads "
                                 ".jsonl, .jsonl.zst, .json.zst, .txt, .gz, .zip, .tar.gz ...") from e
    return itertools.islice(gen(), num_docs)


_worker_state: dict = {}


def _init_worker(tokenizer, append_eod: bool, use_ftfy: bool) -> None:
    _worker_state.update(tokenizer=tokenizer, append_eod=append_eod, ftfy=use_ftfy)


def _encode(text: str) -> tuple[int, list[int]]:
    st = _worker_state
    if st["ftfy"]:
        import ftfy
        text = ftfy.fix_text(text)
    ids = st["tokenizer"].tokenize(text)
    return len(text), (ids + [st["tokenizer"].eod] if st["append_eod"] else ids)


def _bounded(docs, semaphore):
    for doc in docs:
        semaphore.acquire()
        yield doc


def _encoded_docs(docs, tokenizer, append_eod, workers, use_ftfy):
    """Yield (num_chars, ids) per document; batched in-process, or a NeoX-style Pool with imap."""
    if workers > 1:
        # Pool.imap drains its input in a feeder thread; the semaphore caps how far reading may
        # run ahead of writing (NeoX uses 10000 + workers), so memory stays bounded.
        semaphore = threading.Semaphore(10000 + workers)
        with multiprocessing.Pool(workers, initializer=_init_worker, initargs=(tokenizer, append_eod, use_ftfy)) as pool:
            for result in pool.imap(_encode, _bounded(docs, semaphore), chunksize=25):
                semaphore.release()
                yield result
        return
    _init_worker(tokenizer, append_eod, use_ftfy)
    while batch := list(itertools.islice(docs, _BATCH)):
        if use_ftfy:
            encoded = [_encode(t)[1] for t in batch]
        else:
            encoded = tokenizer.tokenize_batch(batch)
            if append_eod:
                encoded = [ids + [tokenizer.eod] for ids in encoded]
        yield from zip(map(len, batch), encoded)


def preprocess(inputs, tokenizer, output_prefix: str, key: str = "text", append_eod: bool = False,
               num_docs: int | None = None, workers: int = 1, log_interval: int | None = None,
               ftfy: bool = False) -> dict:
    """Tokenize every document of `inputs` into `<output_prefix>_<key>_document.{bin,idx}`; returns stats."""
    inputs = _check_inputs(inputs)
    if ftfy:
        try:
            import ftfy as _  # noqa: F401
        except ImportError as e:
            raise ValueError("--ftfy needs the ftfy package, which is not installed; install ftfy or drop --ftfy") from e
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    prefix = output_prefix_for(output_prefix, key)
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    builder = MMapIndexedDatasetBuilder(bin_path(prefix), dtype=best_dtype(tokenizer.vocab_size))
    t0, docs, tokens, chars = time.time(), 0, 0, 0
    for n_chars, ids in _encoded_docs(iter_documents(inputs, num_docs), tokenizer, append_eod, workers, ftfy):
        builder.add_item(np.asarray(ids))
        builder.end_document()
        docs, tokens, chars = docs + 1, tokens + len(ids), chars + n_chars
        if log_interval and docs % log_interval == 0:
            dt = time.time() - t0
            print(f"processed {docs} documents ({docs / dt:.1f} docs/s, {chars / dt / 1e6:.2f} M chars/s)", flush=True)
    builder.finalize(idx_path(prefix))
    seconds = time.time() - t0
    return {"prefix": prefix, "documents": docs, "tokens": tokens, "chars": chars, "seconds": seconds,
            "docs_per_s": docs / max(seconds, 1e-9), "dtype": str(best_dtype(tokenizer.vocab_size))}
