"""Input documents for preprocessing, with the file and line of each one.

JSON lines (`.jsonl`, `.jsonl.zst`) are read here rather than by lm_dataformat so that every bad
input is one DataError naming the file, the line and the fix: invalid JSON, a NUL byte, text that
is null / missing / not a string, invalid UTF-8, a file that is not zstd, and a truncated zstd
stream (which lm_dataformat reads as a silently shorter corpus). The other formats lm_dataformat
knows (.txt, .zip, .tar.gz, .json.zst, ...) are still read by it, with its errors wrapped.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import NamedTuple

import zstandard

from megatron.errors import DataError

TEXT_KEY = "text"  # NeoX always reads the text from "text"; --jsonl-keys only names the output
_READ_BYTES = 1 << 20
FORMATS = ".jsonl, .jsonl.zst, .json.zst, .txt, .gz, .zip, .tar.gz (as lm_dataformat reads them)"
_EXTENSIONS = ("openwebtext.tar.xz", "_data.xz", ".dat.zst", ".jsonl", ".jsonl.zst", ".jsonl.zst.tar", ".json.zst",
               ".txt", ".zip", ".tar.gz", ".json.gz", ".gz")  # lm_dataformat.VALID_EXTENSIONS


class Document(NamedTuple):
    text: str
    path: str
    line: int  # 1-based line in a JSON-lines file; the document number in other formats
    meta: dict  # the line's "meta" object, {} if none (Pile shards carry one)

    @property
    def where(self) -> str:
        """For error messages: "file:line" (or "file (document n)" for formats without lines)."""
        return f"{self.path}:{self.line}" if self.path.endswith((".jsonl", ".jsonl.zst")) else \
            f"{self.path} (document {self.line})"


def _zstd_bytes(path: str) -> Iterator[bytes]:
    """The decompressed bytes of a (possibly multi-frame) zstd file; DataError if it is not zstd
    or ends in the middle of a frame (a truncated download or copy)."""
    dctx = zstandard.ZstdDecompressor()
    dobj, fed = dctx.decompressobj(), False
    with open(path, "rb") as f:
        while chunk := f.read(_READ_BYTES):
            while chunk:
                fed = True
                try:
                    out = dobj.decompress(chunk)
                except zstandard.ZstdError as e:
                    raise DataError(f"{path} cannot be decompressed ({e}): not zstd, or corrupt; re-download or "
                                    "recompress it, or drop the .zst suffix if it is plain jsonl") from e
                if out:
                    yield out
                if dobj.eof:  # the frame ended: anything after it is the next frame
                    chunk, dobj, fed = dobj.unused_data, dctx.decompressobj(), False
                else:
                    chunk = b""
    if fed and not dobj.eof:
        raise DataError(f"{path} is truncated: its zstd stream ends in the middle of a frame (an interrupted "
                        "download or copy); get the complete file again")


def _plain_bytes(path: str) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(_READ_BYTES):
            yield chunk


def _line_blocks(chunks: Iterator[bytes]) -> Iterator[list]:
    """Lists of lines (without newlines), as str when the block is valid UTF-8 (json then skips
    its encoding detection) and as bytes otherwise (parse_line names the bad line). The last,
    unterminated, line comes only after the source is exhausted, so a truncation error is raised
    before a half line could be parsed."""
    tail = b""
    for chunk in chunks:
        block = tail + chunk
        end = block.rfind(b"\n") + 1
        block, tail = block[:end], block[end:]
        if block:
            yield _split(block[:-1])
    if tail:
        yield _split(tail)


def _split(block: bytes) -> list:
    try:
        return block.decode("utf-8").split("\n")
    except UnicodeDecodeError:
        return block.split(b"\n")


def parse_line(line: str | bytes, where: str) -> tuple[str, dict] | None:
    """(text, meta) of one JSON line (None for a blank line); DataError naming `where`."""
    if not line.strip():
        return None
    if ("\x00" if isinstance(line, str) else b"\x00") in line:
        raise DataError(f"{where}: the line contains a NUL byte (binary data, or a corrupt or truncated file); "
                        "remove that line or regenerate the file")
    try:
        obj = json.loads(line)
    except UnicodeDecodeError as e:
        raise DataError(f"{where}: not UTF-8 ({e.reason} at byte {e.start}); re-encode the file as UTF-8") from e
    except json.JSONDecodeError as e:
        raise DataError(f"{where}: invalid JSON ({e.msg}, column {e.colno}); every line must be one JSON object "
                        f'like {{"text": "..."}}: fix or delete that line') from e
    if isinstance(obj, str):  # lm_dataformat's legacy "each line is the string itself"
        return obj, {}
    if not isinstance(obj, dict):
        raise DataError(f'{where}: a JSON {type(obj).__name__}, not an object like {{"text": "..."}}; fix or delete that line')
    if TEXT_KEY not in obj:
        keys = ", ".join(sorted(map(str, obj))[:8]) or "none"
        raise DataError(f'{where}: no "{TEXT_KEY}" key (keys: {keys}); every line needs {{"{TEXT_KEY}": "..."}} '
                        "(NeoX reads the text from that key): fix or delete that line")
    text, meta = obj[TEXT_KEY], obj.get("meta")
    meta = meta if isinstance(meta, dict) else {}
    if isinstance(text, list) and all(isinstance(t, str) for t in text):
        return "\n\n".join(text), meta  # lm_dataformat joins a list of paragraphs
    if not isinstance(text, str):
        raise DataError(f'{where}: "{TEXT_KEY}" is {json.dumps(text)[:40]}, not a string; give the text as a string, '
                        "or delete that line")
    return text, meta


def _read_jsonl(path: str) -> Iterator[Document]:
    chunks = _zstd_bytes(path) if path.endswith(".zst") else _plain_bytes(path)
    lineno = 0
    for lines in _line_blocks(chunks):
        for line in lines:
            lineno += 1
            parsed = parse_line(line, f"{path}:{lineno}")
            if parsed and parsed[0]:
                yield Document(parsed[0], path, lineno, parsed[1])


def _read_other(path: str) -> Iterator[Document]:
    import lm_dataformat  # lazy: it pulls jsonlines/ujson, only needed for these formats

    try:
        for i, text in enumerate(lm_dataformat.Reader(path).stream_data(), start=1):
            if not isinstance(text, str):
                raise DataError(f"{path}: document {i} is a {type(text).__name__}, not text; use .jsonl or .jsonl.zst")
            if text:
                yield Document(text, path, i, {})
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 - a third-party parser: any failure is about this file
        raise DataError(f"{path} cannot be read ({type(e).__name__}: {e}); check the file, or convert it to "
                        ".jsonl / .jsonl.zst, which are read with line-level errors") from e


def list_files(inputs: list[str]) -> list[str]:
    """Files of each input: a file as given, a directory's readable files sorted by name (what
    lm_dataformat.listdir_or_file does, without importing it for the formats read here)."""
    files = []
    for path in inputs:
        if os.path.isdir(path):
            found = [os.path.join(path, n) for n in sorted(os.listdir(path)) if n.endswith(_EXTENSIONS)]
        else:
            found = [path] if os.path.isfile(path) and path.endswith(_EXTENSIONS) else []
        if not found:
            raise DataError(f"input {path!r} has no readable files; supported: {FORMATS}")
        files += found
    return files


def read_documents(inputs: list[str]) -> Iterator[Document]:
    """Every non-empty document of every input, in order, with where it came from."""
    for path in list_files(inputs):
        if path.endswith((".jsonl", ".jsonl.zst")):
            yield from _read_jsonl(path)
        else:
            yield from _read_other(path)
