"""Read character vectors out of an R lazy-load database (`Rdata.rdb` + `Rdata.rdx`), pure Python.

Why: Debian's r-cran-janeaustenr ships the six novels only inside R's binary data files, and
installing R (r-base-core) just to export them is a heavy dependency. The format is small:
- `.rdx` is a gzipped R serialization of list(variables = list(name = c(offset, length)), ...);
- each `.rdb` record at (offset, length) is a 4-byte big-endian uncompressed size + a zlib stream
  (compression type 1, the default) holding one serialized object.
R serialization (XDR, versions 2 and 3) is decoded here for the types data objects use: vectors,
strings, pairlists (attributes), symbols and back-references. Anything else raises ValueError.
"""
from __future__ import annotations

import gzip
import struct
import zlib

NILVALUE, REFSXP, GLOBALENV, EMPTYENV, BASEENV = 254, 255, 253, 242, 241
BASENAMESPACE, MISSINGARG, UNBOUND = 247, 251, 252
SYMSXP, LISTSXP, LANGSXP, CHARSXP, LGLSXP, INTSXP = 1, 2, 6, 9, 10, 13
REALSXP, STRSXP, VECSXP, EXPRSXP, RAWSXP = 14, 16, 19, 20, 24
ATTRLISTSXP, ATTRLANGSXP = 239, 240
_SPECIAL = {NILVALUE, GLOBALENV, EMPTYENV, BASEENV, BASENAMESPACE, MISSINGARG, UNBOUND}


class RObject:
    """A decoded R value: `value` (list / str / None) plus `attributes` (dict name -> RObject value)."""

    def __init__(self, value, attributes: dict | None = None):
        self.value, self.attributes = value, attributes or {}


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.pos, self.refs = data, 0, []

    def int(self) -> int:
        (v,) = struct.unpack_from(">i", self.data, self.pos)
        self.pos += 4
        return v

    def length(self) -> int:
        n = self.int()
        return (self.int() << 32) + self.int() if n == -1 else n

    def header(self) -> None:
        if self.data[:2] != b"X\n":
            raise ValueError(f"not an XDR R serialization (starts with {self.data[:2]!r})")
        self.pos = 2
        version = self.int()
        self.int(), self.int()  # writer and minimal reader versions
        if version == 3:
            n = self.int()  # native encoding name (read the length first: `pos += int()` would use the old pos)
            self.pos += n
        elif version != 2:
            raise ValueError(f"unsupported R serialization version {version}")

    def item(self):
        flags = self.int()
        kind, has_attr, has_tag = flags & 0xFF, bool(flags & (1 << 9)), bool(flags & (1 << 10))
        if kind in _SPECIAL:
            return None
        if kind == REFSXP:
            index = flags >> 8 or self.int()
            return self.refs[index - 1]
        if kind == SYMSXP:
            sym = self.item()  # its CHARSXP name
            self.refs.append(sym)
            return sym
        if kind in (LISTSXP, LANGSXP, ATTRLISTSXP, ATTRLANGSXP):
            return self.pairlist(has_attr, has_tag)
        if kind == CHARSXP:
            n = self.int()
            if n == -1:
                return None  # NA_character_
            s = self.data[self.pos:self.pos + n].decode("utf-8", errors="replace")
            self.pos += n
            return s
        value = self.vector(kind)
        attrs = self.item() if has_attr else None
        return RObject(value, attrs if isinstance(attrs, dict) else {})

    def pairlist(self, has_attr: bool, has_tag: bool) -> dict:
        """A pairlist as an ordered dict tag -> value (attributes are always tagged)."""
        out = {}
        if has_attr:
            self.item()
        tag = self.item() if has_tag else f"[{len(out)}]"
        out[tag] = self.item()
        rest = self.item()
        if isinstance(rest, dict):
            out.update(rest)
        return out

    def vector(self, kind: int):
        n = self.length()
        if kind in (STRSXP, VECSXP, EXPRSXP):
            return [self.item() for _ in range(n)]
        if kind in (INTSXP, LGLSXP):
            vals = struct.unpack_from(f">{n}i", self.data, self.pos)
            self.pos += 4 * n
            return list(vals)
        if kind == REALSXP:
            vals = struct.unpack_from(f">{n}d", self.data, self.pos)
            self.pos += 8 * n
            return list(vals)
        if kind == RAWSXP:
            self.pos += n
            return self.data[self.pos - n:self.pos]
        raise ValueError(f"R type {kind} is not supported by this reader (only data vectors are)")


def unserialize(data: bytes):
    r = _Reader(data)
    r.header()
    return r.item()


def read_lazyload_db(prefix: str) -> dict[str, RObject]:
    """{variable name: RObject} for every variable of `<prefix>.rdb/.rdx` (e.g. .../data/Rdata)."""
    with open(prefix + ".rdx", "rb") as f:
        index = unserialize(gzip.decompress(f.read()))
    names = index.value[0].attributes.get("names")
    if names is None or index.attributes.get("names", RObject([])).value[:1] != ["variables"]:
        raise ValueError(f"{prefix}.rdx is not an R lazy-load index (no `variables` list)")
    out = {}
    with open(prefix + ".rdb", "rb") as f:
        blob = f.read()
    for name, pos in zip(names.value, index.value[0].value):
        offset, length = (int(x) for x in pos.value)
        record = blob[offset:offset + length]
        out[name] = unserialize(zlib.decompress(record[4:]))
    return out
