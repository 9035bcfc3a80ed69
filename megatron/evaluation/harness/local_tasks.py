"""Offline downstream tasks built from the bundled corpus, registered through the harness's own
task YAML mechanism (`dataset_path: json` + `dataset_kwargs.data_files`, TaskManager include_path).

The harness's standard tasks download their datasets; this machine cannot. The quickstart trains
on the Python standard library (tools/prepare_data.py stdlib), and the English prose in it is the
docstrings, so both local tasks are built from docstring paragraphs of the files in the quickstart's
held-out valid and test splits (the stdlib corpus's document order, split 90,5,5): the quickstart
model never trained on them. (The Austen corpus needs a download, so it is not used here.)

    kerple_docstring_lastword  LAMBADA-style: predict the last word of a paragraph (acc, perplexity)
    kerple_docstring_choice    which of 4 continuations follows the first half of a paragraph (acc, acc_norm)

The data files are generated once by tools/make_eval_tasks.py (deterministic: fixed corpus order and
seed) and committed under tasks/ beside this file, so every machine scores the same documents
whatever its Python version. The YAML files are written at run time (write_task_dir) because
`data_files` must be an absolute path: the harness resolves it against the current directory.
"""
from __future__ import annotations

import ast
import json
import os
import random
import re

import yaml

from megatron.data.corpora.stdlib import iter_documents

DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tasks")
TASK_SEED = 1234
SOURCE_SPLIT = "90,5,5"  # the quickstart's split (configs/quickstart.yml): documents of its valid+test ranges

LASTWORD = "kerple_docstring_lastword"
CHOICE = "kerple_docstring_choice"
GROUP = "kerple_local"  # both tasks, by their tag

# Harness task configs (the same keys as lm_eval/tasks/lambada/lambada_openai.yaml and
# hellaswag.yaml), without data_files, which write_task_dir adds.
TASKS = {
    LASTWORD: {
        "tag": [GROUP], "task": LASTWORD, "dataset_path": "json", "output_type": "loglikelihood",
        "test_split": "test", "doc_to_text": "{{context}}", "doc_to_target": "{{' ' + target}}",
        "metric_list": [{"metric": "perplexity", "aggregation": "perplexity", "higher_is_better": False},
                        {"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1.0},
    },
    CHOICE: {
        "tag": [GROUP], "task": CHOICE, "dataset_path": "json", "output_type": "multiple_choice",
        "test_split": "test", "doc_to_text": "{{context}}", "doc_to_target": "{{label}}",
        "doc_to_choice": "{{choices}}",
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True},
                        {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1.0},
    },
}
LOCAL_TASKS = tuple(TASKS)


def data_file(task: str) -> str:
    return os.path.join(DATA_DIR, f"{task}.jsonl")


def write_task_dir(out_dir: str) -> str:
    """Write one harness YAML per local task into `out_dir` (absolute data_files); returns it.
    `lm_eval --include_path OUT_DIR --tasks kerple_local` then runs them outside this stack too."""
    os.makedirs(out_dir, exist_ok=True)
    for name, conf in TASKS.items():
        conf = dict(conf, dataset_kwargs={"data_files": {"test": data_file(name)}})
        with open(os.path.join(out_dir, f"{name}.yaml"), "w") as f:
            yaml.safe_dump(conf, f, sort_keys=False)
    return out_dir


# ---- building the data files (tools/make_eval_tasks.py) ----------------------------------------

WORD = re.compile(r"^[A-Za-z][a-z]+$")


def prose_paragraphs(source: str) -> list[str]:
    """Docstring paragraphs of one Python file that read as English prose: whitespace joined,
    at least 12 words, most of them plain words, no code or reST markup."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        doc = ast.get_docstring(node)
        for para in re.split(r"\n\s*\n", doc or ""):
            words = para.split()
            if len(words) < 12 or any(c in para for c in "`>*=_{}[]|\\#@$"):
                continue
            plain = sum(bool(WORD.match(w.strip(",.;:()'\""))) for w in words)
            if plain >= 0.8 * len(words):
                out.append(" ".join(words))
    return out


def held_out_paragraphs() -> list[str]:
    """Prose paragraphs of the stdlib corpus's valid- and test-split documents (never trained on by
    the quickstart), in corpus order, deduplicated."""
    # lazy: pulls in torch; eval.py's task refusals (task_checks.py) import this module
    from megatron.data.gpt_dataset import split_ranges

    docs = [text for text, _ in iter_documents()]
    _, (start, _), (_, end) = split_ranges(len(docs), SOURCE_SPLIT)
    seen, out = set(), []
    for text in docs[start:end]:
        for p in prose_paragraphs(text):
            if p not in seen:
                seen.add(p)
                out.append(p)
    return out


def lastword_docs(paragraphs: list[str], n: int, rng: random.Random) -> list[dict]:
    """{context, target}: the paragraph ends in a plain word (then '.'), which is the target."""
    docs = []
    for p in paragraphs:
        head, _, last = p.rstrip(".").rpartition(" ")
        if p.endswith(".") and WORD.match(last) and len(last) >= 3 and head:
            docs.append({"context": head, "target": last})
    rng.shuffle(docs)
    return docs[:n]


def choice_docs(paragraphs: list[str], n: int, rng: random.Random, choices: int = 4) -> list[dict]:
    """{context, choices, label}: the paragraph's first half, and its own second half among the
    second halves of `choices - 1` other paragraphs (the harness puts its target_delimiter, a
    space, between context and choice)."""
    halves = []
    for p in paragraphs:
        words = p.split()
        cut = len(words) // 2
        halves.append((" ".join(words[:cut]), " ".join(words[cut:])))
    order = list(range(len(halves)))
    rng.shuffle(order)
    docs = []
    endings = list(dict.fromkeys(second for _, second in halves))  # distinct, in corpus order
    for i in order[:n]:
        true = halves[i][1]  # distractors differ from it and from each other: one right answer
        options = [true] + rng.sample([e for e in endings if e != true], choices - 1)
        rng.shuffle(options)
        docs.append({"context": halves[i][0], "choices": options, "label": options.index(true)})
    return docs


def build_task_files(n_lastword: int = 500, n_choice: int = 300, out_dir: str = DATA_DIR) -> dict[str, int]:
    """Write both data files; returns the number of documents each got."""
    paragraphs = held_out_paragraphs()
    made = {LASTWORD: lastword_docs(paragraphs, n_lastword, random.Random(TASK_SEED)),
            CHOICE: choice_docs(paragraphs, n_choice, random.Random(TASK_SEED + 1))}
    os.makedirs(out_dir, exist_ok=True)
    for name, docs in made.items():
        with open(os.path.join(out_dir, f"{name}.jsonl"), "w") as f:
            for d in docs:
                f.write(json.dumps(d, sort_keys=True) + "\n")
    return {name: len(docs) for name, docs in made.items()}
