"""Fold a GPU check's results (tools/gpu_check.sh OUT_DIR) into docs/benchmarks.md and docs/status.md.

    python tools/gpu_results.py OUT_DIR        # OUT_DIR: what the device call returned (files_at)

Each benchmark file in OUT_DIR (attention.md, attention-hd128.md, train.md, and any other
attention-NAME.md a targeted re-run wrote with --section attention-NAME) replaces its own section
of docs/benchmarks.md; a `gpu-check` section there gets the run's summary (device, each
step's status and time, the test counts and failures from the junit XML, deepy.py's tokens/s and
MFU) and issue 32's goals, each judged from the figures; docs/status.md's `gpu-status` section
gets the same verdicts in a few lines. A --tiny run (toy sizes, any machine) is
refused unless --allow-tiny: its figures say nothing about a GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import xml.etree.ElementTree as ET

from benchmarks.report import markdown_table, markers, replace_section
from megatron.cli_args import ArgumentParser
from megatron.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BENCH_FILES = ["attention", "attention-hd128", "train", "train-ops-gpu"]  # file stem = section name
# Sections a file holds besides its own (the device tool returns at most 8 files: the two step counts share one)
MORE_SECTIONS = {"train-ops-gpu": ["train-ops-pipe-gpu"]}
EXTRA_ATTENTION = re.compile(r"attention-[a-z0-9-]+\.md$")  # a re-run's own section (e.g. attention-inline)
# Issue 32's goals.
FB_LENGTHS = (2048, 16384)  # KERPLE-log fwd+bwd >= 1.0x FlexAttention ALiBi over this range
FWD_LENGTHS = (2048, 65536)  # forward >= 1.0x over this range
TRAIN_GOALS = {"kerple_log vs none": 5.0, "kerple_log vs alibi": 2.0}  # percent, at most
TOKENS_GOAL = 250_000
TEST_SECONDS_GOAL = 240


def load_summary(out: str) -> dict:
    path = os.path.join(out, "summary.json")
    if not os.path.isfile(path):
        raise UserError(f"{out}: no summary.json; give the directory tools/gpu_check.sh wrote (the device "
                        "call's files_at), or run the check first")
    try:
        with open(path) as f:
            summary = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: not a readable JSON summary ({e}); re-run tools/gpu_check.sh") from None
    if summary.get("format") != "kerple-gpu-check/1":
        raise UserError(f"{path}: format {summary.get('format')!r}, expected 'kerple-gpu-check/1'; "
                        "it was not written by tools/gpu_check.py")
    return summary


def section_body(path: str, section: str) -> str | None:
    """The text between a section's markers in a file a benchmark tool wrote, or None."""
    if not os.path.isfile(path):
        return None
    return section_body_text(open(path).read(), section)


def section_body_text(text: str, section: str) -> str | None:
    begin, end = markers(section)
    if begin not in text or end not in text:
        return None
    return text.split(begin, 1)[1].split(end, 1)[0].strip()


def table_rows(body: str, first_header: str) -> list[dict]:
    """The rows of the markdown table whose first header cell is `first_header`, as dicts."""
    lines = body.splitlines()
    for i, line in enumerate(lines):
        cells = split_row(line)
        if cells and cells[0] == first_header:
            rows = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                values = split_row(row)
                rows.append(dict(zip(cells, values)))
            return rows
    return []


def split_row(line: str) -> list[str]:
    if not line.startswith("|"):
        return []
    return [c.strip().replace("\\|", "|") for c in line.strip().strip("|").split(" | ")]


def ratio(cell: str | None) -> float | None:
    if not cell or not cell.endswith("x"):
        return None
    try:
        return float(cell[:-1])
    except ValueError:
        return None


def attention_goals(body: str, label: str) -> list[list[str]]:
    """Per triton KERPLE-log row (bias path): the worst ratio over the goal's lengths, judged."""
    rows = [r for r in table_rows(body, "scheme") if r.get("scheme", "").startswith("kerple_log")
            and r.get("backend", "").startswith("triton")]
    out = []
    for backend in dict.fromkeys(r["backend"] for r in rows):
        mine = [r for r in rows if r["backend"] == backend and r["L"].isdigit()]
        for what, column, (lo, hi) in (("fwd+bwd", "fwd+bwd x base", FB_LENGTHS), ("fwd", "fwd x base", FWD_LENGTHS)):
            wanted = [r for r in mine if lo <= int(r["L"]) <= hi]
            got = {int(r["L"]): ratio(r.get(column)) for r in wanted}
            measured = {n: x for n, x in got.items() if x is not None}
            if not measured:
                verdict = "not measured"
                cell = "-"
            else:
                worst = min(measured.values())
                missing = sorted(set(got) - set(measured))
                verdict = ("met" if worst >= 1.0 else "not met") + (f" (not measured at L = {missing})" if missing else "")
                cell = f"{worst:.2f}x .. {max(measured.values()):.2f}x"
            out.append([f"KERPLE-log {what}, {label}, {backend}", f">= 1.0x FlexAttention ALiBi at L = {lo}-{hi}",
                        cell, verdict])
    return out


def attention_files(out: str) -> list[str]:
    """The attention sections in OUT_DIR: the check's two, then any re-run's, by name."""
    extra = sorted(f[:-3] for f in os.listdir(out) if EXTRA_ATTENTION.fullmatch(f)) if os.path.isdir(out) else []
    return list(dict.fromkeys(["attention", "attention-hd128", *extra]))


def attention_label(name: str, body: str) -> str:
    """'hd 64' from the section's own description line; the section name says which run."""
    m = re.search(r"head dim (\d+)", body)
    hd = f"hd {m.group(1)}" if m else "hd ?"
    return hd if name in ("attention", "attention-hd128") else f"{hd}, {name}"


def train_goals(body: str) -> list[list[str]]:
    rows = {r["sec/step ratio - 1"]: r for r in table_rows(body, "sec/step ratio - 1")}
    out = []
    for name, limit in TRAIN_GOALS.items():
        r = rows.get(name)
        cell = r["ours (this run)"] if r else "-"
        try:
            value = float(cell.rstrip("%"))
            verdict = "met" if value <= limit else "not met"
        except ValueError:
            verdict = "not measured"
        out.append([f"162M step, {name}", f"<= +{limit:g}%", cell, verdict])
    return out


def test_counts(xml_path: str) -> dict | None:
    if not os.path.isfile(xml_path):
        return None
    try:
        root = ET.parse(xml_path).getroot()
    except ET.ParseError as e:
        return {"error": f"unreadable junit XML: {e}"}
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    counts["time"] = sum(float(s.get("time", 0)) for s in suites)
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    bad = []
    for case in root.iter("testcase"):
        for kind in ("failure", "error"):
            node = case.find(kind)
            if node is not None:
                msg = " ".join((node.get("message") or "").split())[:160]
                bad.append(f"{case.get('classname')}::{case.get('name')} ({kind}: {msg})")
    counts["not_passed"] = bad
    return counts


VERBOSE = re.compile(r"\[gw\d+\] \[\s*\d+%\] (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+)")
DOTS = re.compile(r"^([.FEsxX]+)\s*(\[\s*\d+%\])?\s*$")
DOT_KIND = {".": "passed", "F": "failures", "E": "errors", "s": "skipped", "x": "skipped", "X": "passed"}
WORD_KIND = {"PASSED": "passed", "FAILED": "failures", "ERROR": "errors", "SKIPPED": "skipped", "XFAIL": "skipped",
             "XPASS": "passed"}


def counts_from_log(text: str) -> dict | None:
    """When pytest was killed before it wrote its XML: the results its progress output shows
    (`-v` lines with test names, or the dots of -q), marked partial."""
    counts = {"passed": 0, "failures": 0, "errors": 0, "skipped": 0, "not_passed": [], "partial": True}
    named = VERBOSE.findall(text)
    if named:
        for word, test in named:
            counts[WORD_KIND[word]] += 1
            if word in ("FAILED", "ERROR"):
                counts["not_passed"].append(f"{test} ({word.lower()})")
    else:
        dots = [m.group(1) for m in map(DOTS.match, text.splitlines()) if m]
        if not dots:
            return None
        for ch in "".join(dots):
            counts[DOT_KIND[ch]] += 1
    counts["tests"] = sum(counts[k] for k in ("passed", "failures", "errors", "skipped"))
    return counts


def load_throughput(out: str) -> dict | None:
    path = os.path.join(out, "throughput.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"error": "unreadable throughput.json"}


def test_log(out: str) -> str:
    """pytest's output: test-gpu.log if a separate run wrote one, else the test-gpu part of gpu_check.log."""
    path = os.path.join(out, "test-gpu.log")
    if os.path.isfile(path):
        return open(path, errors="replace").read()
    path = os.path.join(out, "gpu_check.log")
    if not os.path.isfile(path):
        return ""
    text = open(path, errors="replace").read()
    part = text.split("===== test-gpu:", 1)
    return part[1].split("\n===== ", 1)[0] if len(part) == 2 else ""


def device_name(summary: dict) -> str:
    d = summary.get("device", {})
    return d.get("gpu") or d.get("nvidia_smi") or "no GPU (CPU)"


def report(out: str, summary: dict) -> tuple[str, str]:
    """(the gpu-check section of docs/benchmarks.md, docs/status.md's gpu-status lines)."""
    d = summary.get("device", {})
    lines = ["## The GPU check (`sh tools/gpu_check.sh`, issue 32)", ""]
    if summary.get("tiny"):
        lines += ["**A --tiny run: toy sizes, its figures say nothing about GPU speed.**", ""]
    lines += [f"- device: {device_name(summary)}; nvidia-smi: {d.get('nvidia_smi') or '-'}; torch {d.get('torch')}, "
              f"CUDA {d.get('cuda')}",
              f"- date {summary.get('date')}; {summary.get('seconds', '-')} s of a {summary.get('seconds_budget')} s clock",
              "", markdown_table(["step", "status", "seconds", "timeout", "note"],
                                 [[s["name"], s["status"], s.get("seconds", "-"), s.get("timeout", "-"),
                                   s.get("why", "")] for s in summary["steps"]], right={2, 3})]
    goals = []
    tests = test_counts(os.path.join(out, "test-gpu.xml"))
    if tests is None:
        tests = counts_from_log(test_log(out))
    test_line = "make test-gpu: not run"
    step = next((st for st in summary["steps"] if st["name"] == "test-gpu"), {})
    if tests and tests.get("partial"):
        test_line = (f"make test-gpu: {step.get('status', 'cut short')} after {step.get('seconds', '?')} s with no junit "
                     f"XML; its progress output shows {tests['tests']} results: {tests['passed']} passed, "
                     f"{tests['failures']} failed, {tests['errors']} errors, {tests['skipped']} skipped")
        goals.append(["make test-gpu", f"0 failed, 0 errors, <= {TEST_SECONDS_GOAL} s",
                      f"{tests['failures']} failed, {tests['errors']} errors; did not finish", "not met"])
    elif tests and "error" not in tests:
        cut = step.get("status") == "timed out"  # interrupted at its clock: the XML counts what finished
        test_line = (f"make test-gpu: {tests['passed']} passed, {tests['failures']} failed, {tests['errors']} errors, "
                     f"{tests['skipped']} skipped in {tests['time']:.0f} s"
                     + (" (interrupted at its clock; tests still running then are not counted)" if cut else ""))
        ok = tests["failures"] == 0 and tests["errors"] == 0 and not cut
        goals.append(["make test-gpu", f"0 failed, 0 errors, <= {TEST_SECONDS_GOAL} s",
                      f"{tests['failures']} failed, {tests['errors']} errors, {tests['time']:.0f} s",
                      "met" if ok and tests["time"] <= TEST_SECONDS_GOAL else "not met"])
    elif tests:
        test_line = f"make test-gpu: {tests['error']}"
    lines += ["", test_line]
    if tests and tests.get("not_passed"):
        lines += ["", "Failed or errored:", ""] + [f"- `{t}`" for t in tests["not_passed"][:40]]
        if len(tests["not_passed"]) > 40:
            lines.append(f"- ... and {len(tests['not_passed']) - 40} more (test-gpu.xml)")
    for name in attention_files(out):
        body = section_body(os.path.join(out, f"{name}.md"), name)
        if body:
            goals += attention_goals(body, attention_label(name, body))
    body = section_body(os.path.join(out, "train.md"), "train")
    if body:
        goals += train_goals(body)
    tp = load_throughput(out)
    tp_line = "deepy.py throughput: not run"
    if tp and tp.get("tokens_per_sec"):
        mfu = tp.get("mfu")
        tp_line = (f"deepy.py throughput (the paper's config, {tp.get('iters')} steps, median of the windows after "
                   f"the first): {tp['tokens_per_sec']:,.0f} tokens/s, MFU {mfu * 100:.1f}%" if mfu is not None
                   else f"deepy.py throughput: {tp['tokens_per_sec']:,.0f} tokens/s, MFU not logged")
        goals.append(["paper config through deepy.py", f">= {TOKENS_GOAL:,} tokens/s, MFU printed",
                       f"{tp['tokens_per_sec']:,.0f}" + (f", MFU {mfu * 100:.1f}%" if mfu is not None else ""),
                       "met" if tp["tokens_per_sec"] >= TOKENS_GOAL and mfu is not None else "not met"])
    elif tp:
        tp_line = f"deepy.py throughput: failed (rc {tp.get('rc')}; gpu_check.log has its output)"
    lines += ["", tp_line]
    if goals:
        lines += ["", "Issue 32's goals, judged from this run's figures:", "",
                  markdown_table(["goal", "target", "measured", "verdict"], goals)]
    met = sum(g[3].startswith("met") for g in goals)
    status = [f"GPU check of {summary.get('date', '')[:10]} on {device_name(summary)}"
              + (" (a --tiny run: no GPU figures)" if summary.get("tiny") else "")
              + f": {test_line}; {tp_line}. Issue 32's goals: {met} of {len(goals)} met "
              "(docs/benchmarks.md, \"The GPU check\")."]
    return "\n".join(lines) + "\n", "\n".join(status) + "\n"


def main() -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="the directory tools/gpu_check.sh wrote")
    p.add_argument("--doc", default=os.path.join(ROOT, "docs", "benchmarks.md"))
    p.add_argument("--status", default=os.path.join(ROOT, "docs", "status.md"), help="the page holding the gpu-status lines")
    p.add_argument("--allow-tiny", action="store_true", help="fold a --tiny run too (tests of this tool)")
    args = p.parse_args()
    if not os.path.isdir(args.out):
        raise UserError(f"{args.out}: not a directory; give the directory tools/gpu_check.sh wrote")
    summary = load_summary(args.out)
    if summary.get("tiny") and not args.allow_tiny:
        raise UserError(f"{args.out} holds a --tiny run (toy sizes): its figures would replace GPU figures in "
                        f"{args.doc}; run the check on a GPU, or pass --allow-tiny for a scratch copy of the docs")
    folded = []
    for name in dict.fromkeys([*BENCH_FILES, *attention_files(args.out)]):
        for section in [name, *MORE_SECTIONS.get(name, [])]:
            body = section_body(os.path.join(args.out, f"{name}.md"), section)
            if body:
                replace_section(args.doc, section, body)
                folded.append(section)
    check, status = report(args.out, summary)
    replace_section(args.doc, "gpu-check", check)
    replace_section(args.status, "gpu-status", status)
    print(f"folded {', '.join(folded) or 'no benchmark sections'} and the gpu-check summary into {args.doc}; "
          f"{args.status}'s GPU status updated:\n{status}")
    return 0
