"""A .safetensors file from elsewhere, read with every declaration of its header checked first.

    [8 bytes: N, little-endian] [N bytes: JSON header] [data]
    header: {"<tensor>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
             "__metadata__": {"format": "pt"}}     (offsets relative to the start of the data)

safetensors' own load_file trusts a header it parsed: a file cut short is a 27-line traceback, and a
header declaring I32 for bytes written as F32 gives integers (the same bytes read as another type).
Here the header is checked against the file's size before a byte of data is read: N fits the
file; every entry has a known dtype, a shape of whole numbers, offsets whose span is exactly
shape x the dtype's size, inside the data, the tensors tiling the data with no gap or overlap
and ending where the file ends (as the format requires). Each failure is one SafetensorsError
naming the file and the tensor. Whether the dtypes and shapes are the ones config.json describes
is hf_weights.py's business; it reads the bytes (`read_tensors`) only after that check too.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os

import torch

from megatron.errors import UserError

MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool, "U16": torch.uint16, "U32": torch.uint32, "U64": torch.uint64,
          "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}
FLOATS = ("F64", "F32", "F16", "BF16")  # what a transformer's weights are saved as, unquantized
RESAVE = "the file is damaged or cut short (a failed download or copy): download or copy it again"


class SafetensorsError(UserError):
    """A .safetensors file whose header does not describe its bytes."""


@dataclasses.dataclass(frozen=True)
class Entry:
    """One tensor as the header declares it; `begin`/`end`: absolute offsets in the file."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def meta(self) -> torch.Tensor:
        """A tensor of this dtype and shape with no data (for checks before reading)."""
        return torch.empty(self.shape, dtype=self.torch_dtype, device="meta")


def read_header(path: str) -> dict[str, Entry]:
    """{tensor name: Entry} of the .safetensors file at `path`, every entry checked (module docstring)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise SafetensorsError(f"{path} has {size} bytes, fewer than a safetensors file's 8-byte header length: "
                                   f"{RESAVE}")
        n = int.from_bytes(head, "little")
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise SafetensorsError(f"{path}: its header declares {n:,} bytes of JSON, but the file has {size:,} "
                                   f"bytes{' (over the format limit of 100 MB)' if n > MAX_HEADER_BYTES else ''}: "
                                   f"{RESAVE}")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise SafetensorsError(f"{path}: its header nests values thousands of levels deep: {RESAVE}") from None
    except ValueError as e:  # UnicodeDecodeError included
        raise SafetensorsError(f"{path}: its header is not valid JSON ({e}): {RESAVE}") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: its header is not a JSON object of tensors: {RESAVE}")
    meta = header.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise SafetensorsError(f"{path}: its header's __metadata__ is not an object of strings: {RESAVE}")
    entries = {key: _entry(path, key, value, 8 + n) for key, value in header.items()}
    _check_tiling(path, entries, 8 + n, size)
    return entries


def _entry(path: str, key: str, value, start: int) -> Entry:
    def bad(what: str) -> SafetensorsError:
        return SafetensorsError(f"{path}: tensor {key!r} {what}: {RESAVE}")

    if not isinstance(value, dict):
        raise bad("is not declared as an object with dtype, shape and data_offsets")
    dtype, shape, offsets = value.get("dtype"), value.get("shape"), value.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise bad(f"has dtype {dtype!r}, which safetensors does not define")
    lists = isinstance(shape, list) and isinstance(offsets, list) and len(offsets) == 2
    if not lists or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in shape + offsets):
        raise bad(f"has shape {shape!r} and data_offsets {offsets!r}, not lists of whole numbers (offsets: 2)")
    begin, end = offsets
    nbytes = math.prod(shape) * DTYPES[dtype].itemsize
    if end - begin != nbytes:
        raise bad(f"declares {dtype} {tuple(shape)} ({nbytes:,} bytes) at data_offsets [{begin}, {end}] "
                  f"({end - begin:,} bytes)")
    return Entry(dtype, tuple(shape), start + begin, start + end)


def _check_tiling(path: str, entries: dict[str, Entry], start: int, size: int) -> None:
    """The tensors cover the data exactly: no gap, no overlap, the last one ending with the file."""
    at = start
    for key, e in sorted(entries.items(), key=lambda kv: (kv[1].begin, kv[1].end)):
        if e.begin != at:
            what = "overlaps the tensor before it" if e.begin < at else f"leaves {e.begin - at:,} bytes unused before it"
            raise SafetensorsError(f"{path}: tensor {key!r} (data_offsets from {e.begin - start}) {what}: {RESAVE}")
        at = e.end
    if at != size:
        raise SafetensorsError(f"{path}: its header declares tensors up to byte {at:,}, but the file has {size:,} "
                               f"bytes ({'cut short' if at > size else 'data after the last tensor'}): {RESAVE}")


def read_tensors(path: str, entries: dict[str, Entry]) -> dict[str, torch.Tensor]:
    """The tensors `entries` declares (read_header's, already checked), each read into memory of its own."""
    out = {}
    with open(path, "rb") as f:
        for key, e in entries.items():
            buf = bytearray(e.end - e.begin)
            f.seek(e.begin)
            if f.readinto(buf) != len(buf):  # the file shrank since its header was checked
                raise SafetensorsError(f"{path} ended inside tensor {key!r} while it was read: {RESAVE}")
            t = torch.frombuffer(buf, dtype=e.torch_dtype) if buf else torch.empty(0, dtype=e.torch_dtype)
            out[key] = t.reshape(e.shape)
    return out
