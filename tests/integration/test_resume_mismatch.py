"""Issue 23: resuming (or evaluating) a checkpoint with a changed model shape ended in DeepSpeed's or
torch's strict-load traceback, and a changed seq-length trained on silently (the sample order
changes). The saved arguments are now compared first: one message naming each differing key and
its two values; a seq-length change needs `allow-seq-length-change: true`."""
import pytest

from megatron.checkpoint.errors import CheckpointError
from megatron.config import load_config
from tests.conftest import hyphenate, train_config_dict, write_token_dataset, write_yaml
from tests.integration.test_checkpoint_safety import _assert_refused, _cli


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from megatron.training.trainer import Trainer

    tmp = tmp_path_factory.mktemp("mismatch")
    data = write_token_dataset(str(tmp / "tiny_text_document"))
    ck = str(tmp / "ck")
    conf = train_config_dict(tmp, data, train_iters=2, save=ck, save_interval=2, eval_iters=1)
    Trainer(load_config([write_yaml(tmp / "t.yml", conf)])).train()
    return conf, ck


def _resume(trained, tmp_path, **over):
    from megatron.training.trainer import Trainer

    conf = hyphenate({**trained[0], "run-dir": str(tmp_path / "run"), "save": None, "load": trained[1],
                      "train-iters": 4, **over})
    return Trainer(load_config([write_yaml(tmp_path / "load.yml", conf)]))


@pytest.mark.parametrize("over,words", [
    ({"hidden_size": 64}, ["hidden-size: checkpoint 32, config 64"]),
    ({"num_layers": 3}, ["num-layers: checkpoint 2, config 3"]),
    ({"pos_emb": "alibi"}, ["pos-emb: checkpoint 'kerple_log', config 'alibi'"]),
    ({"hidden_size": 64, "num_layers": 3}, ["hidden-size: checkpoint 32, config 64", "num-layers: checkpoint 2"]),
])
def test_resume_with_another_shape_names_each_key(trained, tmp_path, over, words):
    with pytest.raises(CheckpointError) as e:
        _resume(trained, tmp_path, **over)
    msg = str(e.value)
    assert all(w in msg for w in words), msg
    assert "global_step2" in msg and "start a new run" in msg


def test_resume_with_another_seq_length_is_refused_unless_accepted(trained, tmp_path):
    with pytest.raises(CheckpointError, match=r"seq-length: checkpoint 32, config 16.*allow-seq-length-change: true"):
        _resume(trained, tmp_path, seq_length=16, max_position_embeddings=32)
    trainer = _resume(trained, tmp_path, seq_length=16, max_position_embeddings=32, allow_seq_length_change=True)
    assert trainer.iteration == 2
    trainer.release()


@pytest.mark.parametrize("override,words", [
    ("hidden-size=64", ["hidden-size: checkpoint 32, -o 64", "Drop those -o overrides"]),
    ("num-layers=3", ["num-layers: checkpoint 2, -o 3"]),
])
def test_evaluate_with_another_shape_is_one_message(trained, tmp_path, override, words):
    proc = _cli("evaluate.py", "--checkpoint", trained[1], "--lengths", "32", "--out", str(tmp_path / "e"),
                "-o", override)
    _assert_refused(proc, *words)


def test_a_refused_resume_through_deepy_leaves_the_run_as_it_was(tmp_path, token_dataset):
    """Issue 43: a resume refused for a changed block (gpt-j-residual) had already rewritten
    run-dir/resolved_config.yml. The launch's config is staged and published by the training
    process only once its checks pass; a refused launch leaves every file of the run as it was,
    and one into a run directory of its own leaves no directory."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT
    from tests.integration.fault_helpers import child_env, run_deepy

    run = tmp_path / "run"
    conf = train_config_dict(tmp_path, token_dataset, train_iters=2, save=str(run / "ck"), load=str(run / "ck"),
                             save_interval=2, eval_iters=1, run_dir=str(run))
    first = write_yaml(tmp_path / "first.yml", conf)
    run_deepy(first)
    before = {p: (run / p).read_bytes() for p in ("resolved_config.yml", "configs/first.yml")}
    listing = sorted(os.listdir(run))
    changed = write_yaml(tmp_path / "changed.yml", hyphenate({**conf, "gpt_j_residual": True, "train_iters": 4}))
    out = subprocess.run([sys.executable, os.path.join(ROOT, "deepy.py"), "train.py", changed], cwd=ROOT,
                         env=child_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "gpt-j-residual" in out.stderr + out.stdout, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    assert {p: (run / p).read_bytes() for p in before} == before
    assert sorted(os.listdir(run)) == listing  # no staging directory, no configs/changed.yml
    # a fresh run directory, refused by the trainer (its `load` holds another model): none left behind
    fresh = tmp_path / "fresh"
    other = write_yaml(tmp_path / "other.yml", hyphenate({**conf, "hidden_size": 64, "run_dir": str(fresh / "run"),
                                                          "save": None, "train_iters": 4}))
    out = subprocess.run([sys.executable, os.path.join(ROOT, "deepy.py"), "train.py", other], cwd=ROOT,
                         env=child_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "hidden-size: checkpoint 32, config 64" in out.stderr, out.stderr[-3000:]
    assert not fresh.exists()
    # the same refusal from train.py itself (no deepy.py): its lock and run directory go too
    out = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), other], cwd=ROOT, env=child_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "hidden-size: checkpoint 32, config 64" in out.stderr, out.stderr[-3000:]
    assert not fresh.exists()


@pytest.mark.parametrize("over,words", [
    ({"pos_emb": "alibi", "num_gpus": 2}, ["pos-emb: checkpoint 'kerple_log', config 'alibi'"]),
    ({"hidden_size": 64}, ["hidden-size: checkpoint 32, config 64"]),
])
def test_deepy_refuses_a_changed_model_before_any_process_starts(trained, tmp_path, monkeypatch, over, words):
    """Issue 45: `deepy.py train.py quickstart.yml -o pos-emb=alibi` (resuming the quickstart's run with
    another model) was refused by the training processes, after the launcher and the process group
    had started (90 s); deepy.py now runs the trainer's checkpoint checks first and starts nothing."""
    import megatron.launch.launcher as launcher

    def started(*a, **k):
        raise AssertionError("a process was started before the refusal")

    monkeypatch.setattr(launcher, "launch_with_deepspeed", started)
    monkeypatch.setattr(launcher.runpy, "run_path", started)
    conf = hyphenate({**trained[0], "run-dir": str(tmp_path / "run"), "save": trained[1], "load": trained[1],
                      "train-iters": 4, **over})
    with pytest.raises(CheckpointError) as e:
        launcher.main(["train.py", write_yaml(tmp_path / "changed.yml", conf)])
    assert all(w in str(e.value) for w in words), str(e.value)
    assert not (tmp_path / "run").exists()  # nothing written
