"""`<run_dir>/metrics.jsonl`: the one reader (and the writer's tail repair), so every tool treats
a damaged file the same way.

The trainer appends one JSON object per line and flushes each row. A writer killed in the middle of
a row leaves a last line without its newline: readers skip it (the row was never complete). Any
other line that is not a JSON object is damage a reader must not guess around: a DataError naming
the file and the line. Before appending again, the writer cuts such a partial last line off
(`trim_partial_line`), so a resumed run never glues a new row onto half an old one.
"""
from __future__ import annotations

import json
import os

from megatron.errors import DataError

METRICS_FILE = "metrics.jsonl"


def metrics_path(run_dir: str) -> str:
    return os.path.join(run_dir, METRICS_FILE)


def parse_rows(lines, name: str) -> list[dict]:
    """Rows of metrics lines (an open file or a list of strings); `name` is the file, for errors."""
    lines = list(lines)
    rows = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if lineno == len(lines) and not line.endswith("\n"):
                break  # the last row of a writer that was killed mid-write: it never happened
            raise DataError(f"{name}:{lineno}: not a JSON row ({e.msg}); the file is damaged there: delete that "
                            "line (rows are independent) or the file") from e
        if not isinstance(row, dict):
            raise DataError(f"{name}:{lineno}: a JSON {type(row).__name__}, not a metrics row; delete that line")
        rows.append(row)
    return rows


def read_metrics(source) -> list[dict]:
    """Every complete row of a metrics.jsonl, given its path or an open text file."""
    if isinstance(source, (str, os.PathLike)):
        with open(source, encoding="utf-8") as f:
            return parse_rows(f, os.fspath(source))
    return parse_rows(source, getattr(source, "name", METRICS_FILE))


def trim_partial_line(path: str) -> bool:
    """Cut a last line without newline (a killed writer's half row) off `path`; True if it did."""
    try:
        with open(path, "rb+") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return False
            f.seek(max(0, size - 1))
            if f.read(1) == b"\n":
                return False
            keep = 0
            for start in range(size - 1, -1, -(1 << 16)):  # scan back for the last newline, in blocks
                lo = max(0, start - (1 << 16) + 1)
                f.seek(lo)
                block = f.read(start - lo + 1)
                nl = block.rfind(b"\n")
                if nl >= 0:
                    keep = lo + nl + 1
                    break
            f.truncate(keep)
            return True
    except FileNotFoundError:
        return False
