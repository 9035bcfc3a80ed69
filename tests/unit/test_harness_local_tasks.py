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
    from megatron.evaluation.harness.task_checks import check_tasks, task_manager

    manager = task_manager([lt.GROUP], str(tmp_path))
    conf = yaml.safe_load(open(tmp_path / f"{lt.LASTWORD}.yaml"))
    assert conf["dataset_path"] == "json" and conf["dataset_kwargs"]["data_files"]["test"] == lt.data_file(lt.LASTWORD)
    assert sorted(check_tasks([lt.GROUP], manager)) == [lt.GROUP]
    tasks = manager.load([lt.CHOICE])["tasks"]
    (task,) = tasks.values()
    docs = list(task.test_docs())
    assert len(docs) == 300 and task.doc_to_choice(docs[0]) == docs[0]["choices"]


def write_user_task(root) -> str:
    """A user's own task directory, as lm-eval takes it: one YAML and its local jsonl data."""
    os.makedirs(root, exist_ok=True)
    data = os.path.join(root, "docs.jsonl")
    with open(data, "w") as f:
        for i in range(5):
            f.write(json.dumps({"q": f"question {i}", "a": f"answer {i}"}) + "\n")
    conf = {"task": "my_own_task", "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": data}},
            "output_type": "loglikelihood", "test_split": "test", "doc_to_text": "{{q}}",
            "doc_to_target": "{{' ' + a}}", "metric_list": [{"metric": "acc"}], "metadata": {"version": 1.0}}
    with open(os.path.join(root, "my_own_task.yaml"), "w") as f:
        yaml.safe_dump(conf, f)
    return str(root)


def test_user_task_directories_register_with_include_path(tmp_path):
    """--include-path DIR: the user's own task YAML is found (without indexing the harness's 15k
    files) and its local data loads, with no network."""
    pytest.importorskip("lm_eval")
    from megatron.evaluation.harness.task_checks import check_task_docs, check_tasks, task_manager

    user = write_user_task(tmp_path / "mine")
    manager = task_manager(["my_own_task", lt.GROUP], str(tmp_path / "local"), include_paths=[user])
    assert sorted(check_tasks(["my_own_task", lt.GROUP], manager)) == sorted(["my_own_task", lt.GROUP])
    (task,) = manager.load(["my_own_task"])["tasks"].values()
    assert [d["a"] for d in task.test_docs()] == [f"answer {i}" for i in range(5)]
    # a single task file named in --tasks, as lm-eval's CLI takes it: checked and loaded by its path
    path = os.path.join(user, "my_own_task.yaml")
    manager = task_manager([path], str(tmp_path / "local"))
    assert check_tasks([path], manager) == [path]
    check_task_docs(manager, [path])


def test_a_missing_include_path_is_one_clear_error(tmp_path):
    pytest.importorskip("lm_eval")
    from megatron.errors import UserError
    from megatron.evaluation.harness.task_checks import task_manager

    with pytest.raises(UserError, match="--include-path .*nowhere.* is not a directory"):
        task_manager(["my_own_task"], str(tmp_path / "local"), include_paths=[str(tmp_path / "nowhere")])


def write_bad_task(root, name, **conf) -> str:
    os.makedirs(root, exist_ok=True)
    base = {"task": name, "dataset_path": "json", "output_type": "loglikelihood", "test_split": "test",
            "doc_to_text": "{{q}}", "doc_to_target": "{{' ' + a}}", "metric_list": [{"metric": "acc"}]}
    with open(os.path.join(root, f"{name}.yaml"), "w") as f:
        yaml.safe_dump({**base, **conf}, f)
    return str(root)


def test_a_users_broken_task_is_one_error_before_the_model_loads(tmp_path):
    """A data file that is not there, a template naming a field the data lacks, a YAML lm-eval
    cannot read (it skips such files silently): each is one UserError naming the task or file."""
    pytest.importorskip("lm_eval")
    from megatron.errors import UserError
    from megatron.evaluation.harness.task_checks import check_task_docs, check_tasks, task_manager

    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"q": "x", "a": "y"}) + "\n")
    user = write_bad_task(tmp_path / "mine", "no_data", dataset_kwargs={"data_files": {"test": str(tmp_path / "gone.jsonl")}})
    write_bad_task(tmp_path / "mine", "bad_field", doc_to_text="{{question}}",
                   dataset_kwargs={"data_files": {"test": str(data)}})
    (tmp_path / "mine" / "broken.yaml").write_text("task: broken\n  x: [\n")
    manager = task_manager(["no_data", "bad_field"], str(tmp_path / "local"), include_paths=[user])
    with pytest.raises(UserError, match=r"task 'no_data' cannot be loaded \(FileNotFoundError: .*gone.jsonl"):
        check_task_docs(manager, ["no_data"])
    with pytest.raises(UserError, match=r"task 'bad_field': its first document does not render "
                                        r"\(UndefinedError: 'question' is undefined"):
        check_task_docs(manager, ["bad_field"])
    with pytest.raises(UserError, match="unknown task 'broken'; lm-eval cannot read these task files in "
                                        "--include-path: .*broken.yaml"):
        check_tasks(["broken"], manager, [user])


def test_a_limited_evaluation_has_its_own_results_file():
    """--limit N scores N documents a task: not comparable with a full run, so never in harness.json."""
    from megatron.evaluation.harness.run import RESULTS_NAME, limit_note, results_name

    assert results_name(None) == RESULTS_NAME == "harness.json" and limit_note(None) == ""
    assert results_name(5) == "harness_limit5.json" and results_name(0.1) == "harness_limit0.1.json"
    assert "not comparable with a full evaluation's (harness.json" in limit_note(5)
