"""Every relative link of the README and the docs points at a file that is there, and a link to a
section (`page.md#anchor`) at a heading that page has. The README's reference moved into docs/
(issue 52): a page renamed, or a heading reworded, would otherwise leave a link that leads nowhere."""
import glob
import os
import re

import pytest

from tests.conftest import ROOT

# A template (docs/results/*.template.md) is checked in the page it renders: summary.template.md's
# links are relative to docs/status.md, where its paragraph goes.
PAGES = ["README.md", *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"),
                                                                         recursive=True)
                              if not p.endswith(".template.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text without code (fenced blocks, inline spans): brackets there are code, not links."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(path: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as
    hyphens; a repeated heading gets -1, -2, ..."""
    with open(path, encoding="utf-8") as f:
        text = re.sub(r"^```.*?^```", "", f.read(), flags=re.S | re.M)
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def relative_links(page: str) -> list[str]:
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        return [t for t in LINK.findall(prose(f.read())) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_the_pages_are_found():
    assert {"README.md", "docs/launching.md", "docs/config.md", "docs/status.md"} <= set(PAGES)
    assert len(relative_links("README.md")) >= 10


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_leads_somewhere(page):
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), path)) if path else os.path.join(ROOT, page)
        if not os.path.exists(full):
            broken.append(f"{target}: no {os.path.relpath(full, ROOT)}")
        elif anchor and full.endswith(".md") and anchor not in anchors(full):
            broken.append(f"{target}: {os.path.relpath(full, ROOT)} has no heading with that anchor")
    assert not broken, f"{page}: " + "; ".join(broken)


def test_the_anchors_are_githubs():
    assert anchors(os.path.join(ROOT, "docs", "evaluation.md")) >= {"evaluation", "evaluation-on-a-cluster",
                                                                    "the-papers-comparison-end-to-end"}
    assert "metrics-neoxs-names-in-tensorboard-and-wb" in anchors(os.path.join(ROOT, "docs", "launching.md"))
