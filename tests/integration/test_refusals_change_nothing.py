"""One rule across the command-line tools (issue 43): a command that ends in a refusal changes
nothing: no directory, resolved config, lock, log or output file is left by it. Each case runs the
tool as a user does, in a directory of its own, and compares the directory's tree before and after."""
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, TINY_MODEL, checkpoint_layout, write_yaml
from tests.integration.fault_helpers import child_env


def tree(root) -> dict:
    """Every path under `root` with its size and modification time."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            out[os.path.relpath(path, root)] = (st.st_size if name in filenames else None, st.st_mtime_ns)
    return out


def config(tmp_path, **over) -> str:
    data = {**TINY_MODEL, "run-dir": str(tmp_path / "run"), "train-iters": 2, "device": "cpu",
            "tokenizer-type": "CharLevelTokenizer", "data-path": str(tmp_path / "missing_text_document"),
            "split": "90,5,5", **{k.replace("_", "-"): v for k, v in over.items()}}
    return write_yaml(tmp_path / "c.yml", data)


def case_deepy_bad_key(tmp_path):
    return ["deepy.py", os.path.join(ROOT, "train.py"), config(tmp_path, **{"pos_embb": "alibi"})], "pos-embb"


def case_deepy_missing_data(tmp_path):
    return ["deepy.py", os.path.join(ROOT, "train.py"), config(tmp_path)], "missing_text_document"


def case_deepy_slots(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=1\n")
    from tests.conftest import write_token_dataset

    data = write_token_dataset(str(tmp_path / "tiny_text_document"))
    return (["deepy.py", os.path.join(ROOT, "train.py"), config(tmp_path, data_path=data, hostfile=str(hostfile), num_gpus=4)],
            "num-gpus: 4 disagrees with the hostfile")


def case_train_py_missing_data(tmp_path):
    return ["train.py", config(tmp_path)], "missing_text_document"


def case_evaluate_no_checkpoint(tmp_path):
    return ["evaluate.py", "--checkpoint", str(tmp_path / "nothing"), "--out", str(tmp_path / "results")], "nothing"


def case_evaluate_empty_layout(tmp_path):
    ck = checkpoint_layout(tmp_path / "ck")  # `latest` names a step directory with no files
    return ["evaluate.py", "--checkpoint", ck, "--out", str(tmp_path / "results")], "global_step4"


def case_generate_no_checkpoint(tmp_path):
    return ["generate.py", "--checkpoint", str(tmp_path / "nothing"), "--prompt", "x"], "nothing"


def case_export_no_checkpoint(tmp_path):
    return ["tools/export_hf.py", "--checkpoint", str(tmp_path / "nothing"), "--out", str(tmp_path / "hf")], "nothing"


def case_merge_no_checkpoint(tmp_path):
    return (["tools/merge_tp_checkpoint.py", "--input", str(tmp_path / "nothing"), "--output", str(tmp_path / "m")],
            "nothing")


def case_import_no_model(tmp_path):
    return ["tools/import_hf.py", "--input", str(tmp_path / "nothing"), "--output", str(tmp_path / "imp")], "nothing"


def case_preprocess_missing_input(tmp_path):
    return (["tools/preprocess_data.py", "--input", str(tmp_path / "missing.jsonl"), "--tokenizer-type",
             "CharLevelTokenizer", "--output-prefix", str(tmp_path / "out" / "data")], "missing.jsonl")


def _trained_run(tmp_path) -> str:
    """A finished 2-step run in tmp_path/run (its train.lock and checkpoints.lock left by training)."""
    from tests.conftest import write_token_dataset

    data = write_token_dataset(str(tmp_path / "tiny_text_document"))
    path = config(tmp_path, data_path=data, train_iters=2, save_interval=2, eval_iters=1)
    subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), path], cwd=tmp_path, env=child_env(),
                   capture_output=True, text=True, timeout=300, check=True)
    return path


def case_train_py_changed_model(tmp_path):
    """Issue 54 item 5: a resume refused because the model changed touched train.lock and checkpoints.lock."""
    import yaml

    path = _trained_run(tmp_path)
    changed = yaml.safe_load(open(path))
    changed["hidden-size"] = 64
    return ["train.py", write_yaml(tmp_path / "changed.yml", changed)], "hidden"


def case_deepy_changed_model(tmp_path):
    args, named = case_train_py_changed_model(tmp_path)
    return ["deepy.py", os.path.join(ROOT, "train.py"), args[1]], named


CASES = [case_deepy_bad_key, case_deepy_missing_data, case_deepy_slots, case_train_py_missing_data,
         case_evaluate_no_checkpoint, case_evaluate_empty_layout, case_generate_no_checkpoint,
         case_export_no_checkpoint, case_merge_no_checkpoint, case_import_no_model, case_preprocess_missing_input,
         case_train_py_changed_model, case_deepy_changed_model]


@pytest.mark.parametrize("case", CASES, ids=[c.__name__[5:] for c in CASES])
def test_a_refused_command_changes_nothing(tmp_path, case):
    args, named = case(tmp_path)
    before = tree(tmp_path)
    out = subprocess.run([sys.executable, os.path.join(ROOT, args[0]), *args[1:]], cwd=tmp_path, env=child_env(),
                         capture_output=True, text=True, timeout=300)
    said = out.stdout + out.stderr
    assert out.returncode != 0, said[-3000:]
    assert named in said and "Traceback" not in said, said[-3000:]
    assert tree(tmp_path) == before, (sorted(set(tree(tmp_path)) ^ set(before)), said[-2000:])
