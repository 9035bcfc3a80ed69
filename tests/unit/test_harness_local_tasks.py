"""The offline local tasks: what the generator extracts, the documents it builds, the committed
data files, and their registration through the harness's own YAML task mechanism."""
import json
import os
import random

import pytest
import yaml

from megatron.evaluation.harness import local_tasks as lt

SOURCE = '''
"""Module docstring that is far too short."""


def f():
    """Return the first element of the sequence, or the default value when the sequence is empty.

    Code like `x = f()` or a >>> prompt is not prose, so this paragraph has to be left out here.
    """
'''

PARAGRAPHS = [f"paragraph number {i} says many plain words about the values it returns to callers." for i in range(9)]
# the same second half twice: never offered as a distractor of its twin (two right answers)
CHOICE_PARAGRAPHS = [f"the paragraph numbered {i} explains how the values {w} back to all of the callers"
                     for i, w in enumerate(["go", "come", "flow", "return", "travel", "go"])]


def test_prose_paragraphs_keeps_long_plain_docstring_paragraphs_only():
    assert lt.prose_paragraphs(SOURCE) == [
        "Return the first element of the sequence, or the default value when the sequence is empty."]
    assert lt.prose_paragraphs("def broken(:") == []


def test_lastword_documents_split_off_the_final_word():
    docs = lt.lastword_docs(PARAGRAPHS, 100, random.Random(0))
    assert len(docs) == len(PARAGRAPHS)
    for d in docs:
        assert d["target"] == "callers" and d["context"] + " " + d["target"] + "." in PARAGRAPHS


def test_choice_documents_hold_the_true_second_half_at_the_label():
    docs = lt.choice_docs(CHOICE_PARAGRAPHS, 6, random.Random(1))
    assert docs == lt.choice_docs(CHOICE_PARAGRAPHS, 6, random.Random(1))  # seeded: the same documents again
    assert len(docs) == 6
    for d in docs:
        whole = d["context"] + " " + d["choices"][d["label"]]
        assert whole in CHOICE_PARAGRAPHS and len(d["choices"]) == 4 == len(set(d["choices"]))
        wrong = [c for i, c in enumerate(d["choices"]) if i != d["label"]]
        assert all(d["context"] + " " + c not in CHOICE_PARAGRAPHS for c in wrong)


def test_committed_data_files_are_small_and_well_formed():
    for name in lt.LOCAL_TASKS:
        assert os.path.getsize(lt.data_file(name)) < 1_000_000
    lastword = [json.loads(line) for line in open(lt.data_file(lt.LASTWORD))]
    choice = [json.loads(line) for line in open(lt.data_file(lt.CHOICE))]
    assert len(lastword) >= 300 and len(choice) == 300
    assert all(lt.WORD.match(d["target"]) and len(d["context"].split()) >= 11 for d in lastword)
    assert all(len(set(d["choices"])) == 4 and 0 <= d["label"] < 4 for d in choice)


def test_tasks_register_through_the_harness_yaml(tmp_path):
    pytest.importorskip("lm_eval")
    from megatron.evaluation.harness.run import check_tasks, task_manager

    manager = task_manager([lt.GROUP], str(tmp_path))
    conf = yaml.safe_load(open(tmp_path / f"{lt.LASTWORD}.yaml"))
    assert conf["dataset_path"] == "json" and conf["dataset_kwargs"]["data_files"]["test"] == lt.data_file(lt.LASTWORD)
    assert sorted(check_tasks([lt.GROUP], manager)) == [lt.GROUP]
    tasks = manager.load([lt.CHOICE])["tasks"]
    (task,) = tasks.values()
    docs = list(task.test_docs())
    assert len(docs) == 300 and task.doc_to_choice(docs[0]) == docs[0]["choices"]
