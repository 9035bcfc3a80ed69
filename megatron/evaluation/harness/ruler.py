"""RULER (Hsieh et al., COLM 2024) through lm-evaluation-harness: its synthetic long-context tasks
at the lengths a user names, every prompt measured with the checkpoint's own tokenizer.

lm-eval's RULER tasks make their documents when they load: each task's `custom_dataset` function
is called with the task metadata, which names the lengths (`max_seq_lengths`) and a Hugging Face
tokenizer (`tokenizer`, else `pretrained`: AutoTokenizer.from_pretrained(name,
trust_remote_code=True), lm_eval/tasks/ruler/common_utils.py) that sizes every prompt to its
length. We write the checkpoint's tokenizer in Hugging Face form with the export's own writer
(megatron/interop/hf_export.save_tokenizer) into <out>/ruler_tokenizer/, name it there, and make
the documents with lm-eval's default seeds after every import they need. Given those documents,
our adapter's answers and scores equal lm-eval's `hf` model on our export, and the export's
tokenizer (`--model_args pretrained=EXPORT`) makes the same documents
(tests/integration/test_harness_ruler.py). A separate `lm_eval` process may draw others: the
generators share Python's global random stream with whatever its process imports after seeding.

Offline here: the needle tasks whose haystack is built in (repeated sentences, or other needles),
variable tracking and the two word-frequency tasks. The essay haystacks and the QA tasks download
their text, so they are refused by name before anything loads; so is a task whose Python package
is missing. Where lm-eval's generators would loop forever (a length too short for the task's
fixed parts, measured with the tokenizer), the length is refused instead.

Scores: each document is scored at its own length; lm-eval names the metric by the length
("1024": the fraction of the expected strings found in the greedy answer, averaged over that
length's documents) and fills every other length its YAML lists with -1, which we drop.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import importlib.util
import io
import logging
import math
import os
import random
import sys

import numpy as np

from megatron.errors import UserError

OFFLINE = ("niah_single_1", "niah_multikey_2", "niah_multikey_3", "ruler_vt", "ruler_cwe", "ruler_fwe")
_ESSAY = ("its haystack is Paul Graham's essays, downloaded from the Hugging Face Hub "
          "(baber/paul_graham_essays), split into sentences by nltk's punkt_tab, another download")
DOWNLOADS = {
    "niah_single_2": _ESSAY, "niah_single_3": _ESSAY, "niah_multikey_1": _ESSAY, "niah_multiquery": _ESSAY,
    "niah_multivalue": _ESSAY,
    "ruler_qa_squad": "its documents are SQuAD 2.0's dev set, downloaded from rajpurkar.github.io",
    "ruler_qa_hotpot": "its documents are HotpotQA's dev set, downloaded from the Hugging Face Hub",
}
TASKS = OFFLINE + tuple(DOWNLOADS)
GROUPS = ("ruler", "longcxt")  # lm-eval's group of the 13 tasks, and its tag of them
# What each task's modules import beyond lm-eval's own requirements (lm_eval[ruler]; all pinned).
# Every RULER YAML includes niah_single_1.yaml, whose function's module (niah_utils: wonderwords,
# nltk) is imported to load any of them, so every task needs those two.
PACKAGES = {"": ("wonderwords", "nltk"), "ruler_fwe": ("scipy",)}
TOKENIZER_DIR = "ruler_tokenizer"  # beside harness.json: lm_eval --metadata '{"tokenizer": ...}' reads it too
# A text like RULER's prompts (words, digits, upper-case names, numbered lists, dots), on which the
# checkpoint's tokenizer and its Hugging Face form must agree token for token.
PROBE = ("Some special magic numbers are hidden within the following text. The grass is green.\n"
         "One of the special magic numbers for alive-tradition is: 7295184.\nVAR QWERT = VAR ASDFG \n"
         "1. xkcdqz 2. ... 3. gfxswy Question: What are all the special magic numbers for 8f3a-1c2e? Answer:")
OFFLINE_HINT = f"the offline RULER tasks are {', '.join(OFFLINE)}"


def ruler_dir() -> str:
    """lm-eval's ruler task folder, found without importing lm-eval (its import costs ~2 s)."""
    spec = importlib.util.find_spec("lm_eval")
    return os.path.join(os.path.dirname(spec.origin), "tasks", "ruler")


def split_tasks(names: list[str]) -> tuple[list[str], list[str]]:
    """(RULER tasks, the other names), each in the order given; a glob that matches any RULER
    task selects among them (expanded and sorted, as lm-eval's CLI expands it)."""
    ruler, other = [], []
    for name in names:
        if name in GROUPS:
            raise UserError(f"--tasks {name}: lm-eval's {name} holds all 13 RULER tasks, and "
                            f"{', '.join(DOWNLOADS)} need downloads; name the tasks instead: {OFFLINE_HINT}")
        matched = fnmatch.filter(TASKS, name)
        if matched:
            ruler += [t for t in sorted(matched) if t not in ruler]
        else:
            other.append(name)
    return ruler, other


def refuse_unavailable(names: list[str]) -> None:
    """A task that downloads its text or imports a missing package: one line naming it and the
    fix, before anything loads."""
    downloads = [n for n in names if n in DOWNLOADS]
    if downloads:
        why = "; ".join(f"{n}: {DOWNLOADS[n]}" for n in downloads)
        raise UserError(f"RULER task{'s' if len(downloads) > 1 else ''} {', '.join(downloads)} need"
                        f"{'' if len(downloads) > 1 else 's'} a download, and this stack never downloads ({why}); "
                        f"drop {'them' if len(downloads) > 1 else 'it'}: {OFFLINE_HINT}")
    missing, needing = [], []
    for name in names:
        for prefix, packages in PACKAGES.items():
            for p in packages:
                if name.startswith(prefix) and importlib.util.find_spec(p) is None:
                    missing += [p] if p not in missing else []
                    needing += [name] if name not in needing else []
    if missing:
        many = len(needing) > 1
        raise UserError(f"RULER task{'s' if many else ''} {', '.join(needing)} need{'' if many else 's'} "
                        f"{' and '.join(missing)}, which {'are' if len(missing) > 1 else 'is'} not installed: install "
                        "the pinned requirements (make setup, or pip install -c constraints.txt -r requirements.txt), "
                        f"or drop {'those tasks' if many else 'that task'}")


def check_lengths(lengths: list[int] | None, names: list[str], max_length: int | None) -> None:
    """--ruler-lengths against the tasks and --max-length, before anything loads."""
    if lengths is not None and not names:
        raise UserError(f"--ruler-lengths {','.join(map(str, lengths))} applies to RULER tasks, and none is named "
                        f"in --tasks: add some ({OFFLINE_HINT}) or drop --ruler-lengths")
    if lengths and max_length is not None and max_length < max(lengths):
        raise UserError(f"--max-length {max_length} is shorter than the longest --ruler-lengths {max(lengths)}: "
                        "its prompts would lose their beginning; drop --max-length (it then follows the longest "
                        "RULER length) or raise it")


def run_length(lengths: list[int], max_length: int | None, model, cfg) -> int:
    """The context the adapter gives RULER: --max-length, else the longest RULER length; refused
    past what the positional scheme represents (learned absolute positions)."""
    limit = model.position.max_length()
    if limit and max(lengths) > limit:
        raise UserError(f"--ruler-lengths {max(lengths)}: pos-emb {cfg.model.pos_emb} represents at most {limit} "
                        f"positions (max-position-embeddings); name lengths of {limit} or less")
    return max(lengths) if max_length is None else max_length


def write_tokenizer(cfg, tokenizer, out_dir: str):
    """The checkpoint's tokenizer in Hugging Face form under out_dir (replaced whole), checked to
    split text as the checkpoint's does; returns (its directory, the loaded HF tokenizer)."""
    from transformers import AutoTokenizer  # lazy: transformers (~1 s), only with RULER tasks

    from megatron.atomic_io import atomic_directory
    from megatron.interop.hf_export import save_tokenizer

    path = os.path.join(out_dir, TOKENIZER_DIR)
    kind = cfg.data.tokenizer_type
    with atomic_directory(path) as tmp:
        written = save_tokenizer(cfg, tmp)
        if written is None:
            raise UserError(f"RULER sizes every prompt with a Hugging Face tokenizer, and the checkpoint's "
                            f"tokenizer-type {kind} has none here (the export writes HFTokenizer, and GPT2BPETokenizer "
                            "with a merge-file): evaluate RULER on a checkpoint trained with one of those, or drop "
                            f"the RULER tasks ({OFFLINE_HINT})")
    hf = AutoTokenizer.from_pretrained(path, trust_remote_code=True)  # as lm-eval's get_tokenizer loads it
    theirs, ours = hf(PROBE).input_ids, tokenizer.tokenize(PROBE)
    if theirs != ours:
        raise UserError(f"the checkpoint's tokenizer ({kind}) and its Hugging Face form in {path} split the same "
                        f"text differently ({len(ours)} vs {len(theirs)} tokens), so RULER would size its prompts "
                        "with the wrong counts; evaluate RULER on a checkpoint whose tokenizer exports exactly "
                        "(HFTokenizer, or GPT2BPETokenizer with a merge-file), or drop the RULER tasks")
    return path, hf


# ---- lengths lm-eval's generators cannot fill -----------------------------------------------------
# ruler_vt, ruler_cwe and ruler_fwe retry forever when their fixed parts do not fit the length
# (a bare `except:` around an assertion, or a word count that shrinks below zero), so the least
# each needs is measured with lm-eval's own functions and the tokenizer, and a shorter length is
# refused. niah_* raise their own error, which load_tasks reports. The generators draw words at
# random: MARGIN covers one draw's difference from another.
MARGIN = 32


def _least_vt(tok) -> int:
    from lm_eval.tasks.ruler import vt_utils as vt  # lazy: lm-eval

    n = len(tok(vt.generate_input_output(5, 1, 4, is_icl=True)[0]).input_ids) + 30
    if n + MARGIN > 500:  # its worked example is sized to 500 tokens, with at least 5 filler sentences
        raise UserError(f"ruler_vt's worked example does not fit its 500 tokens with this tokenizer ({n} tokens "
                        "with the fewest filler sentences): drop ruler_vt")
    with contextlib.redirect_stdout(io.StringIO()):  # it prints its search
        icl = vt.sys_vartrack_w_noise_random(tok, num_samples=1, max_seq_length=500, incremental=5)[0]
    example = len(tok(icl["input"] + " " + " ".join(icl["outputs"]) + "\n\n").input_ids)
    text, answer = vt.generate_input_output(10, 1, 4)  # its fewest filler sentences: 10
    return example + len(tok(text + f" {answer}").input_ids) + 30


def _least_cwe(tok, length: int) -> int:
    from lm_eval.tasks.ruler import cwe_utils as cwe  # lazy: lm-eval, wonderwords

    example, text, answer = cwe.generate_input_output(10, length)  # its fewest words: 10
    numbered = " ".join(f"{i + 1}. {w}" for i, w in enumerate(answer))
    return len(tok(example + "\n" + text + " " + numbered).input_ids) + 120


def _least_fwe(tok) -> int:
    from lm_eval.tasks.ruler import fwe_utils as fwe  # lazy: lm-eval, scipy

    # Its vocabulary is length // 50 coded words, the first one noise: three answers need 200.
    return max(200, len(tok(fwe.TEMPLATE.format(context="", query="")).input_ids) + 1)


def check_lengths_fit(names: list[str], lengths: list[int], tok) -> None:
    """Refuse a length below what ruler_vt / ruler_cwe / ruler_fwe need with this tokenizer."""
    short = []
    for name in names:
        if name == "ruler_vt":
            least = _least_vt(tok) + MARGIN
        elif name == "ruler_cwe":
            least = max(_least_cwe(tok, n) for n in lengths) + MARGIN
        elif name == "ruler_fwe":
            least = _least_fwe(tok)
        else:
            continue
        if min(lengths) < least:
            short.append(f"{name} needs at least {least} (its fixed text and answer with this tokenizer)")
    if short:
        raise UserError(f"--ruler-lengths {min(lengths)} is too short: {'; '.join(short)}; name longer lengths or "
                        "drop those tasks (lm-eval's generators would retry forever)")


# ---- making the documents -------------------------------------------------------------------------

@contextlib.contextmanager
def _offline_generators():
    """lm-eval's needle module (imported to load any RULER task: niah_utils -> prepare_niah) downloads
    nltk's punkt_tab when it is imported, for the essay haystack's sentences, which the offline
    tasks never split: nltk.download is a no-op meanwhile, so nothing is fetched. The generators'
    progress prints go nowhere (the results table stays readable)."""
    import nltk  # lazy: lm-eval's [ruler] extra, pinned; needed only with RULER tasks

    download = nltk.download
    nltk.download = lambda *args, **kwargs: False  # what nltk.download returns when it fetched nothing
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        nltk.download = download


class _DropPlaceholderNotes(logging.Filter):
    """lm-eval's warnings about RULER's own bookkeeping, which say nothing wrong here: the hint to
    pass --metadata (we do), and, for each length, that its metric has no aggregation in the YAML
    (the mean it falls back to is right: only that length's documents report it) and that metrics
    counted different documents (each length counts its own; the rest are the -1 placeholders)."""

    NOTES = ("Custom kwargs can be passed to `--metadata`", "No aggregation function defined for metric",
             "Metrics were not scored on the same number of documents")

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(note in record.getMessage() for note in self.NOTES)


@contextlib.contextmanager
def _without_placeholder_notes():
    loggers = [logging.getLogger(name) for name in ("lm_eval.api.task", "lm_eval.evaluator_utils")]
    note = _DropPlaceholderNotes()
    for logger in loggers:
        logger.addFilter(note)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(note)


def seed_as_lm_eval() -> None:
    """The seeds lm-eval's simple_evaluate sets before it loads tasks (its defaults): the generators
    draw from the global `random` and numpy states, so the documents depend on these and the
    tokenizer alone (import_generators has run first)."""
    from lm_eval.defaults import DEFAULT_OTHER_SEED, DEFAULT_RANDOM_SEED  # lazy: lm-eval

    random.seed(DEFAULT_RANDOM_SEED)
    np.random.seed(DEFAULT_OTHER_SEED)


def task_manager(metadata: dict):
    """A TaskManager over lm-eval's ruler folder only (indexed in well under a second, where the
    full index takes 5-10 s), with `metadata` given to every task."""
    from lm_eval.tasks import TaskManager  # lazy: lm-eval

    return TaskManager(include_path=ruler_dir(), include_defaults=False, metadata=metadata)


MODULES = {"": "niah_utils", "ruler_vt": "vt_utils", "ruler_cwe": "cwe_utils", "ruler_fwe": "fwe_utils"}


def import_generators(names: list[str]) -> None:
    """Import the tasks' modules, and so their packages, before the seed: some imports draw from
    Python's global random stream (wonderwords' pulls in one that does), which the generators
    draw from too; imported first, they leave the documents depending on the seed alone. (The
    needle module's import takes ~10 s: it sorts 6M adjective-noun pairs.)"""
    for prefix, module in MODULES.items():
        if any(n.startswith(prefix) for n in names):
            importlib.import_module(f"lm_eval.tasks.ruler.{module}")


def forget_generator_state() -> None:
    """Drop lm-eval's cached cwe_utils module: its word shuffler (a module-level Random(42)) goes
    on from one load to the next in a process, so only a fresh module makes the same documents
    every time, as a fresh process does. (The other generators keep no state of their own.)"""
    sys.modules.pop("lm_eval.tasks.ruler.cwe_utils", None)


def load_tasks(names: list[str], lengths: list[int], tokenizer_dir: str):
    """(TaskManager, {name: loaded Task}) with every document made. One load of all the names, as
    simple_evaluate does: lm-eval draws a random id from the global stream whenever a task's name
    is read (ConfigurableTask.task_name), which a load reads after building its tasks, so loading
    them one by one would shift the later tasks' documents off those simple_evaluate makes."""
    from lm_eval.tasks.ruler.common_utils import get_tokenizer  # lazy: lm-eval

    get_tokenizer.cache_clear()  # it caches by path, and write_tokenizer may have replaced the files there
    manager = task_manager({"tokenizer": tokenizer_dir, "max_seq_lengths": list(lengths)})
    with _offline_generators(), _without_placeholder_notes():
        import_generators(names)
        forget_generator_state()
        seed_as_lm_eval()
        try:
            tasks = manager.load(list(names))["tasks"]
        except Exception as e:  # noqa: BLE001 - lm-eval's generators raise ValueError, RuntimeError, ...
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            raise UserError(f"RULER task {_failing_task(e) or ', '.join(names)} cannot make its documents at "
                            f"--ruler-lengths {','.join(map(str, lengths))} ({type(e).__name__}: {first}); name "
                            "longer lengths or drop the task") from e
    return manager, {name: tasks[name] for name in names}


def _failing_task(e: Exception) -> str | None:
    """The task being built when `e` was raised: the innermost lm-eval Task method on the stack."""
    name, tb = None, e.__traceback__
    while tb is not None:
        config = getattr(tb.tb_frame.f_locals.get("self"), "_config", None)
        name = getattr(config, "task", None) or name
        tb = tb.tb_next
    return name


def doc_lengths(task) -> list[int]:
    return [int(doc["max_length"]) for doc in task.eval_docs]


def chosen_docs(tasks: dict, limit) -> dict[str, list[int]] | None:
    """--limit per length, not per task: lm-eval's limit takes a task's first documents, which are
    all of its first length. A count (>= 1) or a fraction (< 1) of each length's documents; None
    without a limit."""
    if limit is None:
        return None
    out = {}
    for name, task in tasks.items():
        by_length: dict[int, list[int]] = {}
        for i, length in enumerate(doc_lengths(task)):
            by_length.setdefault(length, []).append(i)
        out[name] = sorted(i for ids in by_length.values()
                           for i in ids[: (int(limit) if limit >= 1 else math.ceil(len(ids) * limit))])
    return out


def keep_lengths(results: dict, lengths: list[int]) -> None:
    """Drop, in place, the -1 that lm-eval reports for every length its YAML lists and the run did
    not ask for; every asked length becomes a metric (higher is better) the record keeps."""
    asked = {str(n) for n in lengths}
    for task, row in results.get("results", {}).items():
        if task not in TASKS:
            continue
        for key in list(row):
            metric = key.partition(",")[0].removesuffix("_stderr")
            if metric.isdigit() and metric not in asked:
                del row[key]
        hib = results.setdefault("higher_is_better", {}).setdefault(task, {})
        for metric in list(hib):
            if metric.isdigit() and metric not in asked:
                del hib[metric]
        hib.update({n: True for n in sorted(asked, key=int)})


def summary(results: dict, prepared) -> dict:
    """The `ruler` section of harness.json: per task and length, the score and how many documents
    it averages; the mean over the tasks at each length (RULER's headline number)."""
    from lm_eval.defaults import DEFAULT_OTHER_SEED, DEFAULT_RANDOM_SEED  # lazy: lm-eval

    lengths, docs = prepared.lengths, prepared.docs
    scores, counts = {}, {}
    for name, task in prepared.tasks.items():
        row = results["results"].get(name, {})
        scores[name] = {str(n): row.get(f"{n},none") for n in lengths}
        got = doc_lengths(task)
        ids = docs[name] if docs is not None else range(len(got))
        counts[name] = {str(n): sum(got[i] == n for i in ids) for n in lengths}
    mean = {}
    for n in map(str, lengths):
        vals = [s[n] for s in scores.values() if isinstance(s[n], (int, float))]
        mean[n] = sum(vals) / len(vals) if vals else None
    return {"lengths": list(lengths), "max_length": prepared.max_length,
            "tokenizer": os.path.abspath(prepared.tokenizer_dir),
            "seeds": {"random": DEFAULT_RANDOM_SEED, "numpy": DEFAULT_OTHER_SEED}, "scores": scores,
            "documents": counts, "mean": mean}


def mean_line(section: dict) -> str:
    parts = ", ".join(f"{n}: {'-' if v is None else f'{v:.3f}'}" for n, v in section["mean"].items())
    return (f"RULER mean over {len(section['scores'])} task{'s' if len(section['scores']) > 1 else ''} "
            f"(fraction of expected answers found, by length): {parts}")


# ---- one RULER evaluation (run.py) ---------------------------------------------------------------

@dataclasses.dataclass
class Prepared:
    """Everything made before the model runs: the tasks with their documents, which of them to score."""
    manager: object
    tasks: dict
    docs: dict | None  # chosen_docs
    lengths: list[int]
    max_length: int
    tokenizer_dir: str


def prepare(names: list[str], lengths: list[int] | None, max_length: int | None, model, cfg, tokenizer,
            out_dir: str, limit=None) -> Prepared:
    """After the model loads (the tokenizer is the checkpoint's): the tokenizer written and checked,
    the lengths checked against it, every document made. Lengths default to --max-length, else the
    training length."""
    lengths = lengths or [max_length if max_length is not None else cfg.model.seq_length]
    length = run_length(lengths, max_length, model, cfg)
    tokenizer_dir, hf = write_tokenizer(cfg, tokenizer, out_dir)
    check_lengths_fit(names, lengths, hf)
    manager, tasks = load_tasks(names, lengths, tokenizer_dir)
    return Prepared(manager, tasks, chosen_docs(tasks, limit), list(lengths), length, tokenizer_dir)


def evaluate(lm, prepared: Prepared, **kwargs) -> dict:
    """lm-eval's simple_evaluate on the prepared tasks (kwargs: its own), the unasked lengths dropped."""
    from lm_eval.evaluator import simple_evaluate  # lazy: lm-eval

    with _without_placeholder_notes():
        results = simple_evaluate(lm, tasks=list(prepared.tasks.values()), task_manager=prepared.manager,
                                  samples=prepared.docs, **kwargs)
    keep_lengths(results, prepared.lengths)
    return results
