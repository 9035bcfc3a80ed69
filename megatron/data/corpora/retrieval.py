"""A corpus meant to teach retrieval at the train length: real text (this interpreter's standard
library, as the quickstart's corpus) with key-value needles hidden in it and questions about them.

Each document is the key-value task's intro, a stretch of filler cut from a stdlib file with
NEEDLES_PER_DOC needles at seeded places ("The special magic number for {key} is {value}."), then
one question per needle in a seeded order, each followed by its answer (the question's words and
the needle's, megatron/data/retrieval_text.py, so evaluation asks in the words the model learned).
A document is about FILLER_CHARS + the needles long: with the quickstart's BPE a training window of
128 tokens holds most of one, so the answers can be copied from inside the window. The keys are
drawn from other words than evaluation's, so no evaluation key is in the training data, and the
evaluation's filler, taken from this corpus's test split, only adds look-alike distractors.
Measured (docs/evaluation.md, "A retrieval corpus"): 800 CPU steps of the quickstart's model are not
enough for it to answer above chance; it is a corpus for longer runs.
"""
from __future__ import annotations

import random

from megatron.data.corpora import stdlib
from megatron.data.corpora.clean import ORDER_SEED, iter_clean
from megatron.data.retrieval_text import TASKS, TRAIN_ANIMALS, TRAIN_COLORS

NEEDLES_PER_DOC = (1, 3)  # inclusive range
FILLER_CHARS = (150, 450)  # inclusive range of the filler's characters per document


def _filler_pieces(max_files: int | None):
    """Stretches of stdlib source, cut at line ends, in the stdlib corpus's seeded file order."""
    for text, meta in stdlib.iter_documents(max_files=max_files):
        lines, piece = text.splitlines(keepends=True), ""
        for line in lines:
            piece += line
            if len(piece) >= FILLER_CHARS[1]:
                yield piece, meta["path"]
                piece = ""


def retrieval_document(rng: random.Random, filler: str) -> str:
    """One document: the intro, the filler with needles at drawn places, one question per needle."""
    task = TASKS["kv"]
    n = rng.randint(*NEEDLES_PER_DOC)
    keys = rng.sample([f"{c} {a}" for c in TRAIN_COLORS for a in TRAIN_ANIMALS], n)
    values = [str(rng.randrange(10 ** (task.digits - 1), 10 ** task.digits)) for _ in keys]
    size = rng.randint(*FILLER_CHARS)
    filler = filler[:size]
    cuts = sorted(rng.randint(0, len(filler)) for _ in keys)
    parts, last = [task.intro], 0
    for cut, key, value in zip(cuts, keys, values):
        parts += [filler[last:cut], task.needle.format(key=key, value=value)]
        last = cut
    parts.append(filler[last:])
    for i in rng.sample(range(n), n):
        parts.append(task.question.format(key=keys[i]) + f" {values[i]}.")
    return "".join(parts) + "\n"


def iter_documents(max_files: int | None = None, max_mb: float | None = None, stats: dict | None = None):
    """(text, meta) documents, seeded (ORDER_SEED): the same corpus on every machine."""
    rng = random.Random(ORDER_SEED)
    stats = {} if stats is None else stats

    def candidates():
        for piece, path in _filler_pieces(max_files):
            yield retrieval_document(rng, piece), {"path": path}

    yield from iter_clean(candidates(), None, max_mb, stats, min_chars=1, normalise=False)
