"""RULER through lm-evaluation-harness (megatron/evaluation/harness/ruler.py) on one tiny trained
checkpoint whose byte-level BPE was trained on RULER-like text, so every offline task fits in
about 900 tokens: the tasks at two lengths with our adapter equal the harness's own `hf` model on
our Hugging Face export, request for request and answer for answer; the results record holds
the per-length scores; what cannot run (a download, a missing package, a tokenizer with no Hugging
Face form, a length too short) is one line naming it and the fix.

Cost (~75 s on the loaded 2-core machine): the needle module's import (~10-18 s: lm-eval sorts 6M
word pairs; every RULER task loads it), 500 documents per task and length, two eval.py refusals.
"""
import contextlib
import io
import json
import os
import random
import subprocess
import sys

import pytest

from tests.conftest import ROOT, train_config_dict, write_token_dataset, write_yaml

pytest.importorskip("lm_eval")
LENGTHS = [1024, 1152]  # ruler_vt's worked example alone is ~500 tokens, so ~900 is its least here


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(config path, checkpoint dir, tokenizer file) of a kerple_log model trained 2 steps."""
    from lm_eval.tasks.ruler import cwe_utils, fwe_utils, vt_utils  # lm-eval's generators: text like their prompts

    from megatron.config import load_config
    from megatron.evaluation.harness import ruler
    from megatron.evaluation.harness.local_tasks import LASTWORD, data_file
    from megatron.tokenizer.train_bpe import train_bytelevel_bpe
    from megatron.training.trainer import Trainer

    tmp = tmp_path_factory.mktemp("ruler")
    random.seed(0)
    texts = [json.loads(line)["context"] for line in open(data_file(LASTWORD))][:200]
    texts += [vt_utils.generate_input_output(10, 1, 4)[0] for _ in range(20)]
    texts += ["\n".join(cwe_utils.generate_input_output(30, 1024)[:2]) for _ in range(20)]
    texts += [fwe_utils.TEMPLATE, ruler.PROBE] * 5
    train_bytelevel_bpe(texts, 1000, str(tmp / "tok.json"))
    prefix = write_token_dataset(str(tmp / "tiny_text_document"), vocab=250)
    data = train_config_dict(tmp, prefix, train_iters=2, save=str(tmp / "run" / "checkpoints"), save_interval=2,
                             tokenizer_type="HFTokenizer", vocab_file=str(tmp / "tok.json"), padded_vocab_size=1024)
    cfg_path = write_yaml(tmp / "t.yml", data)
    Trainer(load_config([cfg_path])).train()
    return cfg_path, str(tmp / "run" / "checkpoints"), str(tmp / "tok.json")


def run(*args, timeout=300):
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                          env=dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1"))
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc


def by_doc(results, task):
    return {s["doc_id"]: s for s in results["samples"][task]}


def test_offline_ruler_tasks_equal_the_harness_hf_model_on_our_export(trained, tmp_path, monkeypatch):
    """Every offline RULER task at two lengths, one document each, scored by our adapter on our
    checkpoint and by the harness's HFLM on tools/export_hf.py's directory: same requests, same
    greedy answers, same per-document and per-length scores. And the documents are the ones lm-eval
    makes from the export itself (`pretrained` = the export, as its CLI passes model_args)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import torch
    import transformers
    from lm_eval.evaluator import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    from megatron.checkpoint.load_model import load_checkpoint_model
    from megatron.evaluation.harness import ruler
    from megatron.evaluation.harness.adapter import KerpleLM
    from megatron.interop.hf_export import export_hf
    from megatron.tokenizer import build_tokenizer

    model, cfg, _ = load_checkpoint_model(trained[1])
    tok = build_tokenizer(cfg.data.tokenizer_type, cfg.data.vocab_file)
    prepared = ruler.prepare(list(ruler.OFFLINE), LENGTHS, None, model, cfg, tok, str(tmp_path / "out"), limit=1)
    assert prepared.max_length == max(LENGTHS)
    ours = ruler.evaluate(KerpleLM(model, tok, prepared.max_length, batch_size=2), prepared, bootstrap_iters=0)

    export_hf(model, cfg, str(tmp_path / "hf"))
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), trust_remote_code=True,
                                                                 dtype=torch.float32).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"), trust_remote_code=True)
    theirs = simple_evaluate(HFLM(pretrained=hf_model, tokenizer=hf_tok, batch_size=2, max_length=prepared.max_length),
                             tasks=list(prepared.tasks.values()), task_manager=prepared.manager, samples=prepared.docs,
                             bootstrap_iters=0)
    for task in ruler.OFFLINE:
        a, b = by_doc(ours, task), by_doc(theirs, task)
        assert sorted(a) == sorted(b) == prepared.docs[task] and len(a) == len(LENGTHS)
        assert sorted(a[i]["doc"]["max_length"] for i in a) == LENGTHS  # one document of each length
        for i in a:
            assert a[i]["arguments"] == b[i]["arguments"], (task, i)  # the prompt and generation settings
            assert a[i]["resps"] == b[i]["resps"], (task, i)  # the greedy answer
            length = str(a[i]["doc"]["max_length"])  # each document reports its own length's score
            assert a[i][length] == b[i][length], (task, i)
        assert {k for k in ours["results"][task] if k[0].isdigit()} == {f"{n},none" for n in LENGTHS} | \
            {f"{n}_stderr,none" for n in LENGTHS}  # lm-eval's -1 for lengths not asked for is gone
        for n in LENGTHS:
            assert ours["results"][task][f"{n},none"] == theirs["results"][task][f"{n},none"], (task, n)

    # The export's own tokenizer, as `lm_eval --model_args pretrained=EXPORT` names it, makes the same
    # documents (one task: each makes 500 per length, which is most of this test's time).
    _, mine = ruler.load_tasks(["ruler_vt"], LENGTHS, prepared.tokenizer_dir)
    stock = ruler.task_manager({"pretrained": str(tmp_path / "hf"), "max_seq_lengths": LENGTHS})
    ruler.seed_as_lm_eval()
    with contextlib.redirect_stdout(io.StringIO()):
        made = stock.load(["ruler_vt"])["tasks"]["ruler_vt"]
    assert [d["input"] for d in made.eval_docs] == [d["input"] for d in mine["ruler_vt"].eval_docs]

    # a length the needle tasks cannot fill is their own error, reported as one line naming the task
    with pytest.raises(ruler.UserError, match=r"RULER task niah_single_1 cannot make its documents at "
                                              r"--ruler-lengths 128 \(ValueError: Could not generate any sample"):
        ruler.load_tasks(["niah_single_1"], [128], prepared.tokenizer_dir)


def test_ruler_scores_per_length_in_the_results_record(trained, tmp_path, capsys):
    """A RULER task beside a local one through evaluate_tasks (eval.py's and evaluate.py's): --limit
    taken per length, harness.json with the asked lengths only, the mean printed. In this process:
    a CLI run would import the needle module again (~10 s; eval.py's wiring: the next tests)."""
    from megatron.evaluation.harness.run import evaluate_tasks

    _, ck, _ = trained
    path = str(tmp_path / "res.json")
    rec = evaluate_tasks(ck, ["ruler_fwe", "kerple_docstring_choice"], str(tmp_path / "out"), ruler_lengths=[256, 320],
                         max_length=320, limit=2, bootstrap_iters=0, results_path=path, log=False)
    out, err = capsys.readouterr()
    assert "max-length 320 (training length 32); RULER at 256,320 tokens with max-length 320" in out
    assert "|ruler_fwe" in out and "RULER mean over 1 task (fraction of expected answers found, by length): 256: " in out
    assert "No aggregation function" not in err and "Custom kwargs" not in err
    assert json.loads(open(path).read()) == json.loads(json.dumps(rec, default=str))
    assert rec["tasks"] == ["kerple_docstring_choice", "ruler_fwe"] and rec["max_length"] == 320
    r = rec["ruler"]
    assert r["lengths"] == [256, 320] and r["max_length"] == 320 and r["documents"] == {"ruler_fwe": {"256": 2, "320": 2}}
    assert r["seeds"] == {"random": 0, "numpy": 1234}
    assert r["tokenizer"] == str(tmp_path / "out" / "ruler_tokenizer")
    assert os.path.isfile(os.path.join(r["tokenizer"], "tokenizer.json"))
    assert set(r["scores"]["ruler_fwe"]) == {"256", "320"} and r["mean"]["256"] == r["scores"]["ruler_fwe"]["256"]
    assert {"ruler_fwe/256", "ruler_fwe/320", "kerple_docstring_choice/acc"} <= set(rec["metrics"])
    assert not any(k.startswith("ruler_fwe/4096") for k in rec["metrics"])
    assert rec["n-samples"]["ruler_fwe"]["effective"] == 4 and rec["n-samples"]["kerple_docstring_choice"]["effective"] == 2


def test_eval_py_passes_ruler_lengths_to_the_evaluation(trained):
    proc = run("eval.py", trained[0], "-o", f"load={trained[1]}", "--eval_tasks", "kerple_local",
               "--ruler-lengths", "512")
    assert proc.returncode == 2 and "--ruler-lengths 512 applies to RULER tasks, and none is named" in proc.stderr


def test_deepy_passes_ruler_lengths_on_as_given():
    from megatron.cli_args import ArgumentParser
    from megatron.evaluation.harness.cli import add_eval_flags, eval_argv

    p = ArgumentParser()
    add_eval_flags(p)
    args = p.parse_args(["--tasks", "ruler_vt", "--ruler-lengths", "1024,2048", "4096"])
    assert eval_argv(args, p) == ["--eval_tasks", "ruler_vt", "--ruler-lengths", "1024,2048", "4096"]


def test_a_task_that_needs_a_download_is_refused_by_name(trained):
    proc = run("eval.py", trained[0], "-o", f"load={trained[1]}", "--eval_tasks", "niah_single_2", "ruler_qa_squad",
               "kerple_local")
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = [x for x in proc.stderr.splitlines() if "error:" in x]
    assert line.startswith("eval.py: error: RULER tasks niah_single_2, ruler_qa_squad need a download, and this stack "
                           "never downloads (niah_single_2: its haystack is Paul Graham's essays"), line
    assert line.endswith("drop them: the offline RULER tasks are niah_single_1, niah_multikey_2, niah_multikey_3, "
                         "ruler_vt, ruler_cwe, ruler_fwe"), line


@pytest.mark.parametrize("kwargs,message", [
    (dict(tasks=["ruler"]), "--tasks ruler: lm-eval's ruler holds all 13 RULER tasks, and niah_single_2"),
    (dict(tasks=["niah_*"]), "RULER tasks niah_multikey_1, niah_multiquery, niah_multivalue, niah_single_2, "
                             "niah_single_3 need a download"),  # a glob expands sorted, as lm-eval's CLI does
    (dict(tasks=["kerple_local"], ruler_lengths=[1024]), "--ruler-lengths 1024 applies to RULER tasks, and none is named"),
    (dict(tasks=["ruler_vt"], ruler_lengths=[1024, 2048], max_length=1024),
     "--max-length 1024 is shorter than the longest --ruler-lengths 2048"),
])
def test_ruler_lengths_are_checked_before_the_model_loads(tmp_path, kwargs, message):
    from megatron.errors import UserError
    from megatron.evaluation.harness.run import evaluate_tasks

    tasks = kwargs.pop("tasks")
    with pytest.raises(UserError) as e:
        evaluate_tasks(str(tmp_path / "no-checkpoint"), tasks, str(tmp_path / "out"), **kwargs)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_missing_package_is_refused_with_the_install_command(monkeypatch):
    import importlib.util

    from megatron.errors import UserError
    from megatron.evaluation.harness import ruler

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wonderwords" else find_spec(name, *a))
    with pytest.raises(UserError) as e:
        ruler.refuse_unavailable(["niah_single_1", "ruler_cwe", "ruler_vt"])
    # every RULER task's YAML includes niah_single_1.yaml, whose module imports wonderwords
    assert str(e.value) == ("RULER tasks niah_single_1, ruler_cwe, ruler_vt need wonderwords, which is not installed: "
                            "install the pinned requirements (make setup, or pip install -c constraints.txt "
                            "-r requirements.txt), or drop those tasks")


def test_ruler_lengths_flag_parses_and_refuses():
    import argparse

    from megatron.errors import UserError
    from megatron.evaluation.harness.cli import length_list, ruler_lengths

    assert ruler_lengths(["1024,2048", "512"]) == [1024, 2048, 512]  # the order given: it is part of the prompts
    with pytest.raises(argparse.ArgumentTypeError, match="must be lengths in tokens"):
        length_list("1k")
    with pytest.raises(UserError, match="--ruler-lengths names 512 more than once"):
        ruler_lengths(["512,1024", "512"])


def test_a_tokenizer_with_no_hugging_face_form_is_refused_by_name(tiny_config, tmp_path):
    from megatron.errors import UserError
    from megatron.evaluation.harness import ruler
    from megatron.tokenizer import CharLevelTokenizer

    cfg = tiny_config(tokenizer_type="CharLevelTokenizer")
    with pytest.raises(UserError, match="RULER sizes every prompt with a Hugging Face tokenizer, and the checkpoint's "
                                        "tokenizer-type CharLevelTokenizer has none here"):
        ruler.write_tokenizer(cfg, CharLevelTokenizer(), str(tmp_path))
    assert not os.path.exists(os.path.join(tmp_path, ruler.TOKENIZER_DIR))  # nothing half-written is left


def test_a_tokenizer_whose_export_splits_differently_is_refused(trained, tiny_config, tmp_path):
    from megatron.errors import UserError
    from megatron.evaluation.harness import ruler
    from megatron.tokenizer import CharLevelTokenizer

    cfg = tiny_config(tokenizer_type="HFTokenizer", vocab_file=trained[2])
    with pytest.raises(UserError, match=r"the checkpoint's tokenizer \(HFTokenizer\) and its Hugging Face form in .* "
                                        "split the same text differently"):
        ruler.write_tokenizer(cfg, CharLevelTokenizer(), str(tmp_path))  # as if the checkpoint's were another


def test_a_length_lm_eval_would_loop_on_forever_is_refused(trained):
    from transformers import PreTrainedTokenizerFast

    from megatron.errors import UserError
    from megatron.evaluation.harness import ruler

    tok = PreTrainedTokenizerFast(tokenizer_file=trained[2])
    with pytest.raises(UserError, match=r"--ruler-lengths 256 is too short: ruler_vt needs at least \d+ .*; "
                                        r"ruler_cwe needs at least \d+"):
        ruler.check_lengths_fit(["ruler_vt", "ruler_cwe", "ruler_fwe", "niah_single_1"], [256, 2048], tok)
    with pytest.raises(UserError, match="ruler_fwe needs at least 200"):
        ruler.check_lengths_fit(["ruler_fwe"], [128], tok)


def test_evaluate_py_tasks_passes_ruler_lengths(monkeypatch, tmp_path):
    """evaluate.py --tasks shares the harness with eval.py: --ruler-lengths reaches it as integers."""
    from megatron.evaluation import sweep as evaluate

    seen = {}
    monkeypatch.setattr(evaluate, "run_tasks", lambda *a, **kw: seen.update(kw))
    args = evaluate.parse_args(["--checkpoint", str(tmp_path), "--tasks", "niah_single_1", "--ruler-lengths", "1024,2048"])
    evaluate.evaluate_tasks(args, str(tmp_path))
    assert seen["ruler_lengths"] == [1024, 2048]
