"""Markdown output shared by the benchmark tools, and rewriting one section of a doc in place.

A tool owns the text between its two markers in the doc, so re-running it replaces its own
figures and leaves every other section (hand-written notes, the other tool's table) alone:

    <!-- bench:attention:begin -->
    ... generated ...
    <!-- bench:attention:end -->

A file without the markers gets the section appended; a missing file is created."""
from __future__ import annotations

import datetime
import os
import platform
import re
import shlex

import torch

from megatron.atomic_io import atomic_output

SECTION_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


def cell(value) -> str:
    """One table cell: text with '|' escaped and newlines folded (reasons can contain both)."""
    return " ".join(str(value).split()).replace("|", "\\|")


def markdown_table(headers: list[str], rows: list[list], right: set[int] | None = None) -> str:
    """A GitHub markdown table; columns whose index is in `right` are right-aligned (numbers)."""
    right = right or set()
    sep = ["---:" if i in right else "---" for i in range(len(headers))]
    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "|".join(sep) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (Linux), else the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass

    return platform.processor() or "unknown CPU"


def device_description(device: torch.device) -> str:
    if device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        return f"{torch.cuda.get_device_name(idx)} (CUDA {torch.version.cuda})"
    n = torch.get_num_threads()
    return f"CPU: {cpu_model()}, {os.cpu_count()} cores, {n} torch thread{'s' if n != 1 else ''}"


def command_line(script: str, argv: list[str]) -> str:
    """The command that reproduces this run, as the user would type it from the repo root."""
    return shlex.join(["python", script, *argv])


def environment_lines(device: torch.device, script: str, argv: list[str]) -> list[str]:
    """The header every generated section starts with: what ran where, when and how."""
    return [
        f"- device: {device_description(device)}",
        f"- torch {torch.__version__}, date {datetime.date.today().isoformat()}",
        f"- command: `{command_line(script, argv)}`",
    ]


def markers(section: str) -> tuple[str, str]:
    return f"<!-- bench:{section}:begin -->", f"<!-- bench:{section}:end -->"


def replace_section(path: str, section: str, body: str) -> None:
    """Put `body` between the section's markers in `path`, keeping everything else byte for byte."""
    if not SECTION_NAME.match(section):
        raise ValueError(f"section name {section!r} must be lower-case letters, digits, '_' or '-'")
    begin, end = markers(section)
    block = f"{begin}\n{body.rstrip()}\n{end}"
    text = ""
    if os.path.exists(path):
        with open(path) as f:
            text = f.read()
    if begin in text and end in text and text.index(begin) < text.index(end):
        head, rest = text.split(begin, 1)
        tail = rest.split(end, 1)[1]
        text = head + block + tail
    elif begin in text or end in text:
        raise ValueError(f"{path}: only one of the markers {begin!r} / {end!r} is present (or they are "
                         "out of order); fix the file by hand before rewriting the section")
    else:
        text = (text.rstrip() + "\n\n" if text.strip() else "# Benchmarks\n\n") + block + "\n"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_output(path, fsync=False) as tmp, open(tmp, "w") as f:  # a crash never truncates the doc
        f.write(text)


def mark_partial(section: str, note: str) -> str:
    """A section written before its run finished: `note` in bold under its heading, so a file a
    killed run left behind says it is incomplete."""
    return section.replace("\n\n", f"\n\n**{note}** (the run was cut off or is still running).\n\n", 1)
