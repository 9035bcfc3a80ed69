"""Downstream tasks end to end on one tiny trained checkpoint (byte-level BPE tokenizer, so the
Hugging Face export carries a tokenizer too): evaluate.py --tasks, `deepy.py eval.py`, the clear
errors (bad task name, missing checkpoint, bad --max-length), and the agreement of our adapter
with the harness's own `hf` model on our Hugging Face export.

Cost: one 2-step training, the harness's import (~2 s per process), and one full TaskManager
index (~5-10 s, the bad-task-name test: unknown names are looked up among the harness's 15k tasks).
"""
import glob
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, train_config_dict, write_token_dataset, write_yaml

pytest.importorskip("lm_eval")
LOCAL = ["kerple_docstring_lastword", "kerple_docstring_choice"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(config path, checkpoint dir) of a kerple_log model trained 2 steps, seq-length 32."""
    from megatron.config import load_config
    from megatron.evaluation.harness.local_tasks import data_file
    from megatron.tokenizer.train_bpe import train_bytelevel_bpe
    from megatron.training.trainer import Trainer

    tmp = tmp_path_factory.mktemp("harness")
    texts = [json.loads(line)["context"] for line in open(data_file(LOCAL[0]))][:200]
    train_bytelevel_bpe(texts, 300, str(tmp / "tok.json"))
    prefix = write_token_dataset(str(tmp / "tiny_text_document"), vocab=250)
    data = train_config_dict(tmp, prefix, train_iters=2, save=str(tmp / "run" / "checkpoints"), save_interval=2,
                             tokenizer_type="HFTokenizer", vocab_file=str(tmp / "tok.json"), padded_vocab_size=384)
    cfg_path = write_yaml(tmp / "t.yml", data)
    Trainer(load_config([cfg_path])).train()
    return cfg_path, str(tmp / "run" / "checkpoints")


def run(*args, timeout=300):
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                          env=dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1"))
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc


def test_evaluate_py_tasks_writes_results_beside_the_perplexity_ones(trained):
    _, ck = trained
    out = os.path.join(os.path.dirname(ck), "eval")  # where evaluate.py puts eval.json too
    os.makedirs(out, exist_ok=True)
    full = os.path.join(out, "harness.json")  # an earlier full evaluation's results
    with open(full, "w") as f:
        f.write('{"full": true}')
    proc = run("evaluate.py", "--checkpoint", ck, "--tasks", *LOCAL, "--limit", "6", "--max-length", "256")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "|kerple_docstring_choice" in proc.stdout and "max-length 256 (training length 32)" in proc.stdout
    # 6 documents a task is a smoke test: its own file, said so, and the full results untouched (issue 45)
    assert open(full).read() == '{"full": true}'
    assert "harness_limit6.json; --limit: scored 6 of each task's documents only, so these scores are not " \
           "comparable with a full evaluation's" in proc.stdout
    rec = json.loads(open(os.path.join(out, "harness_limit6.json")).read())
    assert rec["limit"] == 6
    assert rec["schema"] == "kerple-harness/1" and rec["max_length"] == 256 and rec["train_length"] == 32
    assert rec["iteration"] == 2 and sorted(rec["tasks"]) == sorted(LOCAL) and rec["pos_emb"] == "kerple_log"
    m = rec["metrics"]
    assert set(m) == {"kerple_docstring_lastword/acc", "kerple_docstring_lastword/perplexity",
                      "kerple_docstring_choice/acc", "kerple_docstring_choice/acc_norm"}
    assert 0 <= m["kerple_docstring_choice/acc"] <= 1 and m["kerple_docstring_lastword/perplexity"] > 1
    assert rec["n-samples"]["kerple_docstring_choice"]["effective"] == 6
    # the local tasks' YAML, beside the results, reusable with `lm_eval --include_path`
    assert os.path.isfile(os.path.join(out, "harness_tasks", "kerple_docstring_choice.yaml"))
    # TensorBoard is on (derived from run-dir): the scores went through the training's metrics logger
    rows = [json.loads(line) for line in open(os.path.join(os.path.dirname(ck), "metrics.jsonl"))]
    harness = [r for r in rows if r.get("kind") == "harness"]
    assert harness and harness[-1]["kerple_docstring_choice/acc"] == m["kerple_docstring_choice/acc"]
    assert "harness results at" not in proc.stdout  # the scores are printed once: the harness's table


def test_deepy_eval_py_reads_load_from_the_config(trained, tmp_path):
    cfg_path, ck = trained
    run_dir = os.path.dirname(ck)
    prefix = str(tmp_path / "res")
    proc = run("deepy.py", "eval.py", cfg_path, "-o", f"load={ck}", "--eval_tasks", "kerple_local", "--limit", "3",
               "--eval_results_prefix", prefix, "--max-length", "200")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "|kerple_docstring_lastword" in proc.stdout and "max-length 200 (training length 32)" in proc.stdout
    (path,) = glob.glob(prefix + "_eval_results_*.json")  # NeoX's file name
    assert json.loads(open(path).read())["tasks"] == ["kerple_local"]
    # the training run's resolved config (none here: trained in-process) is left alone; eval's goes to run/eval/
    assert not os.path.exists(os.path.join(run_dir, "resolved_config.yml"))
    assert os.path.isfile(os.path.join(run_dir, "eval", "resolved_config.yml"))


def test_users_own_tasks_quietly_with_the_harness_bootstrap(trained, tmp_path):
    """--include-path DIR (lm-eval's --include_path) runs the user's own task YAML with local data, through
    evaluate.py and deepy.py eval.py; --quiet leaves no progress bar (make eval-tasks wrote 50 KB of
    them); stderr is bootstrapped as the stock harness does (its default iterations, recorded)."""
    import inspect

    from lm_eval.evaluator import simple_evaluate

    from tests.unit.test_harness_local_tasks import write_user_task

    cfg_path, ck = trained
    user = write_user_task(tmp_path / "mine")
    out = str(tmp_path / "out")
    proc = run("evaluate.py", "--checkpoint", ck, "--tasks", "my_own_task", "--include-path", user, "--limit", "3",
               "--out", out, "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "|my_own_task" in proc.stdout
    assert "it/s]" not in proc.stderr and "\r" not in proc.stderr and len(proc.stderr) < 5000, proc.stderr[-3000:]
    rec = json.loads(open(os.path.join(out, "harness_limit3.json")).read())  # --limit: never harness.json
    assert not os.path.exists(os.path.join(out, "harness.json"))
    assert rec["include_paths"] == [os.path.abspath(user)] and rec["tasks"] == ["my_own_task"]
    default = inspect.signature(simple_evaluate).parameters["bootstrap_iters"].default
    assert rec["bootstrap_iters"] == default == 100000
    prefix = str(tmp_path / "neox")
    proc = run("deepy.py", "eval.py", cfg_path, "-o", f"load={ck}", "--eval_tasks", "my_own_task",
               "--include_path", user, "--limit", "2", "--quiet", "--bootstrap-iters", "0", "--eval_results_prefix", prefix)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "it/s]" not in proc.stderr, proc.stderr[-3000:]
    (path,) = glob.glob(prefix + "_eval_results_*.json")
    assert json.loads(open(path).read())["bootstrap_iters"] == 0
    proc = run("evaluate.py", "--checkpoint", ck, "--tasks", "my_own_task", "--include-path", str(tmp_path / "none"))
    assert proc.returncode == 2 and "is not a directory: pass a directory holding your lm-eval task" in proc.stderr


@pytest.mark.parametrize("argv,message", [
    (["--tasks", "lambada_opnai"], "unknown task 'lambada_opnai' (did you mean lambada_openai"),
    (["--tasks", "kerple_local", "--max-length", "1"], "--max-length 1 must be an integer of at least 2"),
    (["--tasks", "kerple_local", "--max-length", "lots"], "argument --max-length: invalid int value"),
])
def test_evaluate_py_task_errors(trained, argv, message):
    proc = run("evaluate.py", "--checkpoint", trained[1], *argv)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]


def test_missing_checkpoint_is_one_clear_error(trained, tmp_path):
    proc = run("evaluate.py", "--checkpoint", str(tmp_path / "nowhere"), "--tasks", "kerple_local")
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    proc = run("deepy.py", "eval.py", trained[0], "-o", f"load={tmp_path / 'nowhere'}", "--eval_tasks", "kerple_local")
    # the config is fine, the checkpoint is not on this machine: EXIT_MISSING_INPUTS
    assert proc.returncode == 3 and "no such directory; point it at a checkpoint directory" in proc.stderr
    # a fresh clone: load is the run's own (derived) checkpoint directory, never trained into
    proc = run("deepy.py", "eval.py", trained[0], "-o", f"save={tmp_path / 'fresh' / 'checkpoints'}",
               "--eval_tasks", "kerple_local")
    assert proc.returncode == 2 and "no checkpoint to evaluate; train first" in proc.stderr, proc.stderr[-2000:]
    proc = run("deepy.py", "train.py", trained[0], "--eval_tasks", "kerple_local")
    assert proc.returncode == 2 and "only eval.py takes these flags" in proc.stderr


def test_max_length_past_learned_positions_is_refused(tmp_path):
    from megatron.config import load_config
    from megatron.training.trainer import Trainer

    prefix = write_token_dataset(str(tmp_path / "tiny_text_document"))
    ck = str(tmp_path / "ck")
    data = train_config_dict(tmp_path, prefix, train_iters=1, save=ck, save_interval=1, pos_emb="learned",
                             padded_vocab_size=512)
    Trainer(load_config([write_yaml(tmp_path / "t.yml", data)])).train()
    proc = run("evaluate.py", "--checkpoint", ck, "--tasks", "kerple_docstring_choice", "--max-length", "64")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "--max-length 64: pos-emb learned represents at most 32 positions" in proc.stderr


def test_the_readme_lm_eval_hf_recipe_imports():
    """`lm_eval --model hf` (docs/evaluation.md's recipe on an export) imports accelerate, lm-eval's [hf]
    extra: it is a pinned requirement, installed at that version."""
    from importlib.metadata import version

    import accelerate  # noqa: F401
    from lm_eval.api.registry import get_model

    lines = [line.split("#")[0].strip() for line in open(os.path.join(ROOT, "requirements.txt"))]
    pins = dict(line.split("==") for line in lines if "==" in line)
    assert pins["accelerate"] == version("accelerate")
    assert get_model("hf").__name__ == "HFLM"  # what --model hf resolves to


def per_request_loglikelihoods(results, task):
    return {s["doc_id"]: [r[0][0] for r in s["resps"]] for s in results["samples"][task]}


def test_adapter_agrees_with_the_harness_hf_model_on_our_export(trained, tmp_path, monkeypatch):
    """Two independent paths, batch size 4 (padded batches on both sides), fp32, CPU: our adapter on our checkpoint, and the
    harness's HFLM on tools/export_hf.py's directory (AutoModelForCausalLM + AutoTokenizer,
    trust_remote_code). Every request's log-likelihood agrees within 1e-4 absolute (sums of ~100
    token log-probs of size ~6: fp32 rounding in a different summation/matmul order gives ~1e-5),
    and so every metric is equal."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import torch
    import transformers
    from lm_eval.evaluator import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    from megatron.checkpoint.load_model import load_checkpoint_model
    from megatron.evaluation.harness.adapter import KerpleLM
    from megatron.evaluation.harness.task_checks import task_manager
    from megatron.interop.hf_export import export_hf
    from megatron.tokenizer import build_tokenizer

    model, cfg, _ = load_checkpoint_model(trained[1])
    export_hf(model, cfg, str(tmp_path / "hf"))
    manager = task_manager(LOCAL, str(tmp_path / "tasks"))
    length, limit = 256, 12
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), trust_remote_code=True,
                                                                 dtype=torch.float32).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"), trust_remote_code=True)
    tok = build_tokenizer(cfg.data.tokenizer_type, cfg.data.vocab_file)
    assert hf_tok.eos_token_id == hf_tok.bos_token_id == tok.eod  # HFLM's end-of-text and prefix token
    theirs = simple_evaluate(HFLM(pretrained=hf_model, tokenizer=hf_tok, batch_size=4, max_length=length),
                             tasks=LOCAL, limit=limit, task_manager=manager, bootstrap_iters=0)
    ours = simple_evaluate(KerpleLM(model, tok, length, batch_size=4), tasks=LOCAL, limit=limit,
                           task_manager=manager, bootstrap_iters=0)
    for task in LOCAL:
        a, b = per_request_loglikelihoods(ours, task), per_request_loglikelihoods(theirs, task)
        assert sorted(a) == sorted(b) == list(range(limit))
        for doc in a:
            assert a[doc] == pytest.approx(b[doc], abs=1e-4, rel=0), (task, doc)
        for key, value in ours["results"][task].items():
            if isinstance(value, float) and not key.endswith("_stderr,none"):
                assert theirs["results"][task][key] == pytest.approx(value, rel=1e-6), (task, key)
