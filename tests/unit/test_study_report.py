"""The study's report is generated from the run records: the committed docs/results/README.md,
claims.md and docs/status.md's study paragraph are what the records give today (a figure typed by
hand or left stale fails here), and the study package sits above the evaluation library."""
import ast
import glob
import os

import pytest

from study.claims import BLOCK, Claims, render, report_texts, with_block
from tests.conftest import ROOT

RESULTS = os.path.join(ROOT, "docs", "results")


def test_the_committed_report_is_what_the_records_give():
    from study.convergence import load_records
    from study.results import load_results

    records = os.path.join(RESULTS, "runs")
    files = sorted(f for f in glob.glob(os.path.join(records, "*", "eval*.json"))
                   if os.path.isfile(os.path.join(os.path.dirname(f), "record.json")))
    texts = report_texts(load_results(files), load_records(records), RESULTS, ROOT)
    fix = ("regenerate: python tools/make_report.py --records docs/results/runs --out docs/results ... "
           "--status-page docs/status.md")
    for name in ("README.md", "claims.md"):
        with open(os.path.join(RESULTS, name)) as f:
            assert f.read() == texts[name], f"docs/results/{name} differs from the records; {fix}"
    with open(os.path.join(ROOT, "docs", "status.md")) as f:  # moved there from the README (issue 52)
        status = f.read()
    assert with_block(status, texts["summary"], "docs/status.md") == status, f"docs/status.md's study paragraph is stale; {fix}"


def test_a_placeholder_without_a_claim_is_named():
    claims = Claims()
    claims.add("known", "1.0")
    assert render("a {{known}} b", claims) == "a 1.0 b"
    with pytest.raises(ValueError, match="no claim named typo_one, typo_two"):
        render("{{ typo_two }} {{known}} {{typo_one}}", claims, "t.md")
    with pytest.raises(ValueError, match="defined twice"):
        claims.add("known", "2")


def test_the_root_block_needs_its_markers():
    assert with_block(f"a\n{BLOCK[0]}\nold\n{BLOCK[1]}\nb", "new\n", "R") == f"a\n{BLOCK[0]}\nnew\n{BLOCK[1]}\nb"
    with pytest.raises(ValueError, match="R: no '<!-- study:summary:begin -->'"):
        with_block("no markers", "x", "R")


def test_evaluation_imports_nothing_from_the_study():
    """megatron/evaluation/ is what a user calls to evaluate a model; the study reads what it writes."""
    found = []
    for path in glob.glob(os.path.join(ROOT, "megatron", "evaluation", "**", "*.py"), recursive=True):
        for node in ast.walk(ast.parse(open(path).read())):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{os.path.relpath(path, ROOT)}: {m}" for m in mods if m.startswith("study")]
    assert found == []
