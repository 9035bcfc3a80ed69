"""`<run_dir>/metrics.jsonl`: the one reader (and the writer's tail repair), so every tool treats
a damaged file the same way.

The trainer appends one JSON object per line and flushes each row. A writer killed in the middle of
a row leaves a last line without its newline: readers skip it (the row was never complete). Any
other line that is not a JSON object is damage a reader must not guess around: a DataError naming
the file and the line. Before appending again, the writer cuts such a partial last line off
(`trim_metrics`, which on resume also drops the rows of the steps the run will redo), so a
resumed run never glues a new row onto half an old one.
"""
from __future__ import annotations

import json
import os

from megatron.atomic_io import atomic_output
from megatron.errors import DataError

METRICS_FILE = "metrics.jsonl"
TEXT_KEYS = ("kind", "device", "torch")  # the row's kind and the `start` row's words; every other value is a number


def row_problem(row: dict) -> str | None:
    """What is wrong with a row's shape (the writer, process/logging.py, writes these), or None:
    `iteration` a whole number >= 0, the TEXT_KEYS text, every other value a number or null."""
    step = row.get("iteration")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return f"`iteration` is {step!r}, not a step number" if "iteration" in row else "`iteration` is missing"
    for key, value in row.items():
        if key in TEXT_KEYS:
            if not isinstance(value, str):
                return f"`{key}` is {value!r}, not text"
        elif key != "iteration" and value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            return f"`{key}` is {str(value)[:40]!r}, not a number"
    return None


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
        problem = row_problem(row)
        if problem:
            raise DataError(f"{name}:{lineno}: {problem}: the row is damaged; delete that line (rows are independent)")
        rows.append(row)
    return rows


def read_metrics(source) -> list[dict]:
    """Every complete row of a metrics.jsonl, given its path or an open text file."""
    if isinstance(source, (str, os.PathLike)):
        with open(source, encoding="utf-8") as f:
            return parse_rows(f, os.fspath(source))
    return parse_rows(source, getattr(source, "name", METRICS_FILE))


def trim_metrics(path: str, after: int | None) -> None:
    """Drop the rows of `path` whose iteration is past `after` (None: keep every complete row) and
    a torn last line left by a killed writer; rewritten atomically, untouched if nothing changes.
    A line that is not JSON (other than a torn last one) is kept as it is."""
    try:
        with open(path, "rb") as f:
            lines = f.read().split(b"\n")
    except FileNotFoundError:
        return
    tail = lines.pop()  # text after the last newline: usually a row its writer never finished
    if tail and _row(tail) is not None:  # a complete row that only lacks its newline
        lines.append(tail)
    kept = [line for line in lines if not _past(line, after)]
    if not tail and len(kept) == len(lines):
        return
    with atomic_output(path) as tmp, open(tmp, "wb") as f:
        f.write(b"".join(line + b"\n" for line in kept))


def _row(line: bytes) -> dict | None:
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) else None


def _past(line: bytes, after: int | None) -> bool:
    iteration = (_row(line) or {}).get("iteration") if after is not None else None
    return isinstance(iteration, int) and iteration > after
