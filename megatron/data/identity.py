"""A dataset's identity: which .bin, which .idx and which tokenizer belong together.

The MMIDIDX files carry no build id (and must stay byte-compatible with NeoX), so an .idx from
another build with the same token count passed every structural check (document boundaries and
the splits silently changed), and data written by another tokenizer whose ids fit the vocabulary
trained and evaluated as if it were text (ppl 530, exit 0). The identity lives in a sidecar,
`<prefix>.identity.json`, written when the dataset is published (indexed.py's builder, before
the .idx: a dataset is complete when its .idx exists, and then its sidecar exists too):

    {"format": "kerple-dataset-identity/1",
     "bin": {"bytes": N, "sampled_blake2b": "...", "block_bytes": 65536, "blocks": 64},
     "idx": {"bytes": M, "sampled_blake2b": "...", "block_bytes": 65536, "blocks": 1024},
     "tokenizer": {"description": "HFTokenizer (vocab-file data/x/tokenizer.json)",
                   "fingerprint": "...", "vocab_size": V, "eod": E} | null}

Cheap for any size: a file's fingerprint is its size and a hash of `blocks` evenly spaced blocks
of 64 KiB (the whole file when it is smaller): at most 4 MiB of a .bin and 64 MiB of an .idx are
read (an .idx is hashed whole up to ~5M documents; beyond, its pointers are cumulative, so another
build's differ almost everywhere and any sample shows it). Readers check the pair on every open
(once per file version per process), and training and evaluation check the tokenizer. A
tokenizer's fingerprint is what it does, not where its files are: vocab size, end-of-document id
and the ids of a fixed probe text, so a copied or renamed vocabulary file is the same tokenizer.

A dataset without the sidecar (NeoX's own, or written before this) still loads; the reader says
once that its identity is unchecked. Fixtures writing with the builder and no tokenizer record
`"tokenizer": null`: their pair is checked, their tokenizer is not.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys

from megatron.atomic_io import atomic_output
from megatron.errors import DataError
from megatron.tokenizer import build_tokenizer

FORMAT = "kerple-dataset-identity/1"
BLOCK_BYTES = 1 << 16
BIN_BLOCKS = 64  # 4 MiB read per .bin
IDX_BLOCKS = 1024  # 64 MiB per .idx: whole up to ~5M documents
# Several scripts, digits, code and whitespace: two different tokenizers split it differently.
PROBE = ("The quick brown fox jumps over the lazy dog. 0123456789 +-*/=<>[]{}()\n"
         "def f(x):\n\treturn x ** 2  # comment\n  indented   spaces\r\n"
         "Zoë naïve café – “quotes” ½ € ✓ Ελληνικά кириллица 中文 日本語 한국어 🙂\n")

_checked: dict[tuple, dict | None] = {}  # (file versions) -> the sidecar they matched
_noted: set[str] = set()  # prefixes already reported as unchecked


def identity_path(prefix: str) -> str:
    return prefix + ".identity.json"


def file_fingerprint(path: str, blocks: int) -> dict:
    """Size and a blake2b of `blocks` evenly spaced BLOCK_BYTES blocks (the whole file if smaller)."""
    size = os.path.getsize(path)
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        if size <= blocks * BLOCK_BYTES:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        else:
            step = (size - BLOCK_BYTES) / (blocks - 1)  # first block at 0, last one ending at size
            for i in range(blocks):
                f.seek(int(i * step))
                h.update(f.read(BLOCK_BYTES))
    return {"bytes": size, "sampled_blake2b": h.hexdigest(), "block_bytes": BLOCK_BYTES, "blocks": blocks}


def describe_tokenizer(tokenizer) -> str:
    """'HFTokenizer (vocab-file data/x/tokenizer.json)': the type and the files it was built from."""
    files = [a for a in getattr(tokenizer, "_init_args", ()) if isinstance(a, str) and os.path.isfile(a)]
    named = ", ".join(f"{key} {path}" for key, path in zip(("vocab-file", "merge-file"), files))
    name = getattr(tokenizer, "name", type(tokenizer).__name__)
    return f"{name} ({named})" if named else name


def tokenizer_identity(tokenizer) -> dict:
    """What the tokenizer does (module docstring), plus a description for messages."""
    probe = {"vocab_size": int(tokenizer.vocab_size), "eod": int(tokenizer.eod),
             "ids": [int(i) for i in tokenizer.tokenize_batch([PROBE])[0]]}  # what preprocess calls
    digest = hashlib.blake2b(json.dumps(probe).encode(), digest_size=16).hexdigest()
    return {"description": describe_tokenizer(tokenizer), "fingerprint": digest,
            "vocab_size": probe["vocab_size"], "eod": probe["eod"]}


def write_identity(path: str, bin_file: str, idx_file: str, tokenizer: dict | None) -> None:
    """The sidecar for the pair (bin_file, idx_file), written atomically at `path`."""
    record = {"format": FORMAT, "bin": file_fingerprint(bin_file, BIN_BLOCKS),
              "idx": file_fingerprint(idx_file, IDX_BLOCKS), "tokenizer": tokenizer}
    with atomic_output(path) as tmp, open(tmp, "w") as f:
        json.dump(record, f, indent=1)


def read_identity(prefix: str) -> dict | None:
    """The sidecar of `prefix`, or None when it has none (a NeoX or older dataset)."""
    path = identity_path(prefix)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            record = json.load(f)
        if record.get("format") != FORMAT:
            raise ValueError(f"format {record.get('format')!r}, expected {FORMAT!r}")
        return record
    except (OSError, ValueError, AttributeError, RecursionError) as e:  # RecursionError: JSON nested thousands deep
        raise DataError(f"{path} is not a readable dataset identity ({e}); delete it to load the dataset "
                        "unchecked, or rebuild the dataset with tools/preprocess_data.py --overwrite") from None


def _version(path: str) -> tuple:
    st = os.stat(path)
    return os.path.abspath(path), st.st_size, st.st_mtime_ns, st.st_ino


def check_pair(prefix: str, idx_file: str, bin_file: str) -> dict | None:
    """Raise DataError unless the .bin and .idx are the ones the sidecar recorded; returns the
    sidecar (None without one, noted once per prefix)."""
    sidecar = identity_path(prefix)
    if not os.path.isfile(sidecar):
        note_unchecked(prefix, f"it has no {os.path.basename(sidecar)} (a NeoX dataset, or one written before "
                               "datasets carried an identity)")
        return None
    key = (_version(sidecar), _version(idx_file), _version(bin_file))
    if key in _checked:
        return _checked[key]
    record = read_identity(prefix)
    for name, path, blocks in (("bin", bin_file, BIN_BLOCKS), ("idx", idx_file, IDX_BLOCKS)):
        want = record.get(name) or {}
        if file_fingerprint(path, want.get("blocks", blocks)) != want:
            raise DataError(
                f"{path} is not the .{name} that {sidecar} recorded for this dataset: the .bin and .idx come from "
                f"different builds (or the .{name} changed since), so documents and splits would silently differ; "
                "rebuild the dataset with tools/preprocess_data.py --overwrite (or restore the matching files)")
    _checked[key] = record
    return record


def note_unchecked(prefix: str, why: str) -> None:
    """Say once per prefix (and only on rank 0) that a dataset's identity is not checked."""
    if prefix in _noted:
        return
    _noted.add(prefix)
    if os.environ.get("RANK", "0") == "0":
        print(f"note: {prefix}: dataset identity unchecked: {why}; rebuild it with tools/preprocess_data.py "
              "to have its .bin/.idx pairing and tokenizer checked", file=sys.stderr, flush=True)


def check_tokenizer(prefix: str, data_cfg) -> None:
    """Raise DataError when the dataset at `prefix` was written by another tokenizer than the one
    `data_cfg` (tokenizer-type, vocab-file, merge-file) builds. The tokenizer is built only when
    the sidecar records one."""
    settings = (data_cfg.tokenizer_type, data_cfg.vocab_file, data_cfg.merge_file)
    sidecar = identity_path(prefix)
    key = (_version(sidecar), settings) if os.path.isfile(sidecar) else None
    if key in _checked:  # this tokenizer already matched this dataset in this process
        return
    record = read_identity(prefix)
    wrote = record and record.get("tokenizer")
    if not wrote:
        if record is not None:  # a pair written without a tokenizer (the builder used directly)
            note_unchecked(prefix, "its writer recorded no tokenizer")
        return

    try:
        ours = tokenizer_identity(build_tokenizer(data_cfg.tokenizer_type, data_cfg.vocab_file, data_cfg.merge_file))
    except (ValueError, OSError) as e:
        note_unchecked(prefix, f"this run's tokenizer cannot be built to compare ({str(e)[:200]})")
        return
    if ours["fingerprint"] == wrote["fingerprint"]:
        _checked[key] = record
        return
    raise DataError(
        f"{prefix}.bin was written by the tokenizer {wrote['description']} (vocab size {wrote['vocab_size']}), "
        f"but this run reads it with {ours['description']} (vocab size {ours['vocab_size']}): its token ids "
        f"would be read as other text. Set tokenizer-type/vocab-file to the ones that wrote it, or rebuild it "
        f"with this run's tokenizer (tools/preprocess_data.py --tokenizer-type {data_cfg.tokenizer_type} ...)")
