"""Corpus -> `<name>.jsonl.zst` -> byte-level BPE `tokenizer.json` -> `<name>_text_document.{bin,idx}`.

Each step is skipped when its output exists, is valid, and was built with the same parameters
(recorded in prepare_state.json); rebuilding a step rebuilds every step after it.
"""
from __future__ import annotations

import glob
import json
import os
import time

import zstandard

from megatron.data.corpora import get_corpus
from megatron.data.indexed import IndexedDatasetError, MMapIndexedDataset
from megatron.data.preprocess import iter_documents, output_prefix_for, preprocess
from megatron.tokenizer.hf import HFTokenizer
from megatron.tokenizer.train_bpe import train_bytelevel_bpe

STATE_FILE = "prepare_state.json"


def write_jsonl_zst(docs, path: str, level: int = 3) -> int:
    """Write {"text", "meta"} lines, zstd-compressed (lm_dataformat.Reader reads this), atomically."""
    tmp, n = path + ".tmp", 0
    with open(tmp, "wb") as raw, zstandard.ZstdCompressor(level=level).stream_writer(raw, closefd=False) as zf:
        for text, meta in docs:
            zf.write((json.dumps({"text": text, "meta": meta}, ensure_ascii=False) + "\n").encode("utf-8"))
            n += 1
    os.replace(tmp, path)
    return n


def _load_state(out_dir: str) -> dict:
    try:
        with open(os.path.join(out_dir, STATE_FILE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _save_state(out_dir: str, state: dict) -> None:
    tmp = os.path.join(out_dir, STATE_FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(state, f, indent=1, sort_keys=True)
    os.replace(tmp, os.path.join(out_dir, STATE_FILE))


def _tokenizer_ok(path: str) -> bool:
    try:
        HFTokenizer(path)
        return True
    except ValueError:
        return False


def _dataset_ok(prefix: str) -> bool:
    try:
        return len(MMapIndexedDataset(prefix)) > 0
    except IndexedDatasetError:
        return False


def _step(state, name, params, output_ok, rebuild, build, log):
    """Run `build()` unless the step's recorded params match and its output is valid."""
    done = state.get(name, {})
    if not rebuild and done.get("params") == params and output_ok():
        log(f"[{name}] exists, skipping")
        return False
    t0 = time.time()
    stats = build()
    state[name] = {"params": params, "stats": stats, "seconds": round(time.time() - t0, 2)}
    log(f"[{name}] built in {time.time() - t0:.1f}s: {stats}")
    return True


def prepare_corpus(name: str, data_dir: str = "data", vocab_size: int = 8192, max_mb: float | None = None,
                   max_files: int | None = None, force: bool = False, workers: int = 1, log=print) -> dict:
    """Build (or reuse) data_dir/name/{name.jsonl.zst, tokenizer.json, name_text_document.*}; returns a summary."""
    corpus, t0 = get_corpus(name), time.time()
    out_dir = os.path.join(data_dir, name)
    os.makedirs(out_dir, exist_ok=True)
    archive = os.path.join(out_dir, f"{name}.jsonl.zst")
    tok_path = os.path.join(out_dir, "tokenizer.json")
    out_prefix = os.path.join(out_dir, name)
    state = _load_state(out_dir)

    def build_archive():
        stats = {}
        docs = write_jsonl_zst(corpus.documents(max_files=max_files, max_mb=max_mb, stats=stats), archive)
        return {"documents": docs, "files": stats["files"], "mb": round(stats["bytes"] / 1e6, 3),
                "duplicates_skipped": stats.get("duplicates", 0)}

    def build_tokenizer():
        # The training texts are read back from the archive, so tokenizer and dataset see the same corpus.
        tok = train_bytelevel_bpe(iter_documents([archive]), vocab_size, tok_path)
        return {"vocab_size": tok.get_vocab_size()}

    def build_tokens():
        for stale in glob.glob(glob.escape(output_prefix_for(out_prefix)) + "_*_indexmap_*"):
            os.remove(stale)  # GPTDataset index maps of the previous .bin would no longer match
        stats = preprocess([archive], HFTokenizer(tok_path), out_prefix, append_eod=True, workers=workers)
        return {"documents": stats["documents"], "tokens": stats["tokens"], "dtype": stats["dtype"]}

    corpus_params = {"max_mb": max_mb, "max_files": max_files, "order": corpus.order}
    rebuilt = _step(state, "corpus", corpus_params, lambda: os.path.isfile(archive),
                    force, build_archive, log)
    rebuilt = _step(state, "tokenizer", {"vocab_size": vocab_size}, lambda: _tokenizer_ok(tok_path),
                    force or rebuilt, build_tokenizer, log)
    dataset = output_prefix_for(out_prefix)
    _step(state, "tokens", {"append_eod": True}, lambda: _dataset_ok(dataset), force or rebuilt, build_tokens, log)
    _save_state(out_dir, state)
    return {"corpus": name, "archive": archive, "tokenizer": tok_path, "data_prefix": dataset,
            **{k: state["corpus"]["stats"][k] for k in ("files", "mb", "documents")},
            "tokens": state["tokens"]["stats"]["tokens"], "vocab_size": state["tokenizer"]["stats"]["vocab_size"],
            "seconds": round(time.time() - t0, 2)}
