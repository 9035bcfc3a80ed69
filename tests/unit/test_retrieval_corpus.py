"""The retrieval training corpus (megatron/data/corpora/retrieval.py): real stdlib text with kv needles
and a question per needle answered in the kv task's own words, seeded, with keys that evaluation
never asks about."""
import itertools
import re

from megatron.data.corpora import CORPORA
from megatron.data.corpora.retrieval import NEEDLES_PER_DOC, iter_documents
from megatron.data.retrieval_text import ADJECTIVES, NOUNS, TASKS

NEEDLE = re.compile(r"The special magic number for ([a-z]+ [a-z]+) is (\d{7})\.")
QUESTION = re.compile(r"\nThe special magic number for ([a-z]+ [a-z]+) is (\d{7})\.")


def test_documents_hide_needles_and_answer_a_question_about_each():
    docs = [text for text, _ in itertools.islice(iter_documents(max_files=20), 200)]
    assert docs == [text for text, _ in itertools.islice(iter_documents(max_files=20), 200)]  # seeded
    evaluation_keys = {f"{a} {n}" for a in ADJECTIVES for n in NOUNS}
    for text in docs:
        assert text.startswith(TASKS["kv"].intro)
        body, _, questions = text.partition("\nThe special magic number for ")
        needles = dict(NEEDLE.findall(body))
        answers = dict(QUESTION.findall("\nThe special magic number for " + questions))
        assert NEEDLES_PER_DOC[0] <= len(needles) <= NEEDLES_PER_DOC[1]
        assert answers == needles  # every needle asked about once, with its own value
        assert not set(needles) & evaluation_keys
    assert "retrieval" in CORPORA
