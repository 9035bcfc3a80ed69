"""Documents (jsonl, jsonl.zst, txt, ...; see megatron/data/documents.py) -> tokenized MMIDIDX dataset.

The reusable core of tools/preprocess_data.py: each non-empty document becomes one item
(+ end_document) in `<output_prefix>_<key>_document.{bin,idx}`, NeoX's layout.
"""
from __future__ import annotations

import collections
import itertools
import os
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import numpy as np

from megatron.data.documents import Document, read_documents
from megatron.data.identity import tokenizer_identity
from megatron.data.indexed import (
    MMapIndexedDatasetBuilder,
    best_dtype,
    bin_path,
    dataset_exists,
    idx_path,
)
from megatron.errors import DataError, UserError, writing
from megatron.outputs_vs_inputs import refuse_overlap

_BATCH = 256  # documents per tokenize_batch call in the single-process path
_POOL_BATCH = 64  # documents per task sent to a worker process (NeoX's imap used chunks of 25)


def output_prefix_for(output_prefix: str, key: str = "text") -> str:
    return f"{output_prefix}_{key}_document"


def _check_inputs(inputs) -> list[str]:
    if isinstance(inputs, str):
        inputs = inputs.split(",")
    inputs = [p.strip() for p in inputs if p.strip()]
    if not inputs:
        raise DataError("no input given; pass --input file1.jsonl.zst,dir2,...")
    for path in inputs:
        if not os.path.exists(path):
            raise DataError(f"input {path!r} does not exist; pass existing files or directories to --input")
    return inputs


def iter_documents(inputs: list[str], num_docs: int | None = None):
    """Non-empty document texts from every input, in order (the text always comes from "text", as in NeoX)."""
    return (doc.text for doc in itertools.islice(read_documents(inputs), num_docs))


# ----------------------------------------------------------------------------- tokenizing

_worker_state: dict = {}


def _init_worker(tokenizer, append_eod: bool, use_ftfy: bool) -> None:
    _worker_state.update(tokenizer=tokenizer, append_eod=append_eod, ftfy=use_ftfy)


def _tokenize(texts: list[str]) -> list[list[int]]:
    st = _worker_state
    tok = st["tokenizer"]
    if st["ftfy"]:
        import ftfy  # lazy: only with --ftfy (an optional package)
        texts = [ftfy.fix_text(t) for t in texts]
    encoded = tok.tokenize_batch(texts)
    return [ids + [tok.eod] for ids in encoded] if st["append_eod"] else list(encoded)


def _encode_batch(batch: list[Document]) -> list[list[int]]:
    """Token ids per document. Runs in the worker processes too, where an exception must reach the
    parent as a DataError (always picklable, unlike e.g. a tokenizer's own exception classes,
    whose failed unpickling hung multiprocessing.Pool forever) naming the document."""
    try:
        return _tokenize([d.text for d in batch])
    except Exception:  # noqa: BLE001 - find the document that fails, and say which one
        for doc in batch:
            try:
                _tokenize([doc.text])
            except Exception as e:  # noqa: BLE001
                raise DataError(f"{doc.where}: the tokenizer failed on this document "
                                f"({type(e).__name__}: {str(e)[:200]}); fix or delete it") from None
        raise DataError(f"{batch[0].where}: the tokenizer failed on this batch of {len(batch)} documents "
                        "but not on any one of them; run again with --workers 1") from None


def _batches(docs, size: int):
    while batch := list(itertools.islice(docs, size)):
        yield batch


def _encoded_docs(docs, tokenizer, append_eod, workers, use_ftfy):
    """Yield (document, ids) in input order; batched in-process, or in `workers` processes.

    The documents are read in this (the main) thread and handed out in batches, at most a few
    per worker in flight, so memory stays bounded and an input error is raised right here. A
    concurrent.futures pool reports a worker that dies (BrokenProcessPool) instead of hanging."""
    if workers <= 1:
        _init_worker(tokenizer, append_eod, use_ftfy)
        for batch in _batches(docs, _BATCH):
            yield from zip(batch, _encode_batch(batch))
        return
    pool = ProcessPoolExecutor(workers, initializer=_init_worker, initargs=(tokenizer, append_eod, use_ftfy))
    pending: collections.deque = collections.deque()
    try:
        for batch in _batches(docs, _POOL_BATCH):
            pending.append((batch, pool.submit(_encode_batch, batch)))
            while len(pending) > 2 * workers:
                batch, future = pending.popleft()
                yield from zip(batch, future.result())
        while pending:
            batch, future = pending.popleft()
            yield from zip(batch, future.result())
    except BrokenProcessPool as e:
        raise UserError(f"a tokenizer worker process died while encoding the documents from {batch[0].where} on "
                        f"({e}); killed for memory? use fewer --workers") from e
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


# ----------------------------------------------------------------------------- the whole run


def preprocess(inputs, tokenizer, output_prefix: str, key: str = "text", append_eod: bool = False,
               num_docs: int | None = None, workers: int = 1, log_interval: int | None = None,
               ftfy: bool = False, overwrite: bool = False) -> dict:
    """Tokenize every document of `inputs` into `<output_prefix>_<key>_document.{bin,idx}`; returns stats.

    The dataset is written under temporary names and published only when the whole input was
    read without error and gave at least one document; an existing dataset at the prefix is
    replaced only with overwrite=True, and is untouched by any failure."""
    inputs = _check_inputs(inputs)
    if ftfy:
        try:
            import ftfy as _  # noqa: F401  (lazy: probes for the optional ftfy package)
        except ImportError as e:
            raise DataError("--ftfy needs the ftfy package, which is not installed; install ftfy or drop --ftfy") from e
    if workers < 1:
        raise DataError(f"workers must be >= 1, got {workers}")
    if num_docs is not None and num_docs < 1:  # islice would raise a ValueError naming no flag
        raise DataError(f"num_docs (--num-docs) must be >= 1, got {num_docs}; leave it unset for every document")
    prefix = output_prefix_for(output_prefix, key)
    for out in (bin_path(prefix), idx_path(prefix)):  # never among the documents, never over one of them
        refuse_overlap("--output-prefix", out, [("the data being read (--input)", p) for p in inputs])
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    dtype = best_dtype(tokenizer.vocab_size)
    t0, docs, tokens, chars = time.time(), 0, 0, 0
    kept = "nothing was written" + (f": the existing {prefix}.bin/.idx are unchanged" if dataset_exists(prefix) else "")
    with writing("the dataset", prefix, kept), MMapIndexedDatasetBuilder(bin_path(prefix), dtype=dtype, overwrite=overwrite,
                                   tokenizer=tokenizer_identity(tokenizer)) as builder:
        documents = itertools.islice(read_documents(inputs), num_docs)
        for doc, ids in _encoded_docs(documents, tokenizer, append_eod, workers, ftfy):
            builder.add_item(np.asarray(ids))
            builder.end_document()
            docs, tokens, chars = docs + 1, tokens + len(ids), chars + len(doc.text)
            if log_interval and docs % log_interval == 0:
                dt = time.time() - t0
                print(f"processed {docs} documents ({docs / dt:.1f} docs/s, {chars / dt / 1e6:.2f} M chars/s)", flush=True)
        if docs == 0:
            raise DataError(f"no documents in {', '.join(inputs)} (every line empty, or no text); nothing was written"
                            + (f" and the existing {prefix}.bin/.idx are unchanged" if dataset_exists(prefix) else ""))
        builder.finalize(idx_path(prefix))
    seconds = time.time() - t0
    return {"prefix": prefix, "documents": docs, "tokens": tokens, "chars": chars, "seconds": seconds,
            "docs_per_s": docs / max(seconds, 1e-9), "dtype": str(dtype)}
