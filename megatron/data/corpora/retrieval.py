"""A corpus meant to teach retrieval at the train length: real text (this interpreter's standard
library, as the quickstart's corpus) with key-value needles hidden in it and questions about them.

Each document is the key-value task's intro, then NEEDLES_PER_DOC needles ("The special magic number
for {key} is {value}.") each after a stretch of filler cut from a stdlib file (GAP_CHARS characters),
then one question per needle in a seeded order, each followed by its answer (the question's words and
the needle's, megatron/data/retrieval_text.py, so evaluation asks in the words the model learned).
Why this density: the answers are what teaches copying, and a first version with 1-3 needles in
150-450 characters of filler (answers ~5% of the tokens) did not teach it in 800 CPU steps
(docs/evaluation.md, "A retrieval corpus"). Here about half the tokens are needles and answers, and a
document is about one training window (128 tokens of the quickstart's BPE), so most questions can
be answered from inside the window. Measured: 600 CPU steps of this design do not teach it either
(the answer's value tokens cost what the needle's do): it is a corpus for a GPU run
(tools/extrapolation_study.py). The keys are drawn from other words than evaluation's, so no
evaluation key is in the training data, and the evaluation's filler, taken from this corpus's test
split, only adds look-alike distractors.
"""
from __future__ import annotations

import random

from megatron.data.corpora import stdlib
from megatron.data.corpora.clean import ORDER_SEED, iter_clean
from megatron.data.retrieval_text import TASKS, TRAIN_ANIMALS, TRAIN_COLORS

NEEDLES_PER_DOC = (2, 5)  # inclusive range
GAP_CHARS = (0, 60)  # inclusive range of the filler's characters before each needle
PIECE_CHARS = NEEDLES_PER_DOC[1] * GAP_CHARS[1]  # one stdlib stretch holds every gap of a document


def _filler_pieces(max_files: int | None):
    """Stretches of stdlib source, cut at line ends, in the stdlib corpus's seeded file order."""
    for text, meta in stdlib.iter_documents(max_files=max_files):
        lines, piece = text.splitlines(keepends=True), ""
        for line in lines:
            piece += line
            if len(piece) >= PIECE_CHARS:
                yield piece, meta["path"]
                piece = ""


def retrieval_document(rng: random.Random, filler: str) -> str:
    """One document: the intro, needles each after a drawn gap of filler, one question per needle."""
    task = TASKS["kv"]
    n = rng.randint(*NEEDLES_PER_DOC)
    keys = rng.sample([f"{c} {a}" for c in TRAIN_COLORS for a in TRAIN_ANIMALS], n)
    values = [str(rng.randrange(10 ** (task.digits - 1), 10 ** task.digits)) for _ in keys]
    parts, start = [task.intro], 0
    for key, value in zip(keys, values):
        gap = rng.randint(*GAP_CHARS)
        parts += [filler[start:start + gap], task.needle.format(key=key, value=value)]
        start += gap
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
