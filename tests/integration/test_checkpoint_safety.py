"""Checkpoint trust and safety on real checkpoints written by the Trainer (ZeRO-2: model states plus
a DeepSpeed optimizer partition): no code runs from a crafted file unless trusted, `latest` cannot
point outside the directory, NaN/inf weights are refused unless allowed, a failed save says so."""
import os
import shutil
import subprocess
import sys

import pytest
import torch

from megatron.checkpoint.errors import CheckpointError, CheckpointSaveError, UnsafeCheckpointError
from megatron.checkpoint.safe_load import safe_torch_load
from megatron.checkpoint.tags import read_latest
from megatron.config import load_config
from tests.conftest import ROOT, hyphenate, reseal_manifest, train_config_dict, write_yaml
from tests.integration.fault_helpers import child_env, train_checkpoint

MODEL_FILE = "mp_rank_00_model_states.pt"


class _CreatesMarker:
    """Unpickling this runs code: it opens (creates) the marker file."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(config dict, checkpoint dir with global_step2 and global_step4), written by the Trainer."""
    return train_checkpoint(tmp_path_factory.mktemp("safety"), zero_optimization={"stage": 2})


@pytest.fixture
def ck(trained, tmp_path):
    """A private copy of the trained checkpoint directory."""
    dst = str(tmp_path / "ck")
    shutil.copytree(trained[1], dst)
    return dst


def _trainer(trained, tmp_path, **over):
    from megatron.training.trainer import Trainer

    conf = hyphenate({**trained[0], "run-dir": str(tmp_path / "run"), "save": None, **over})
    return Trainer(load_config([write_yaml(tmp_path / "load.yml", conf)]))


def _cli(script, *args, env=None):
    return subprocess.run([sys.executable, os.path.join(ROOT, script), *args], capture_output=True, text=True,
                          cwd=ROOT, env=env or child_env(), timeout=300)


def _assert_refused(proc, *words):
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for w in words:
        assert w in proc.stderr, proc.stderr[-3000:]


def test_trainer_files_load_safely_and_resume_without_trust(trained, tmp_path, monkeypatch):
    """Every file the Trainer writes loads with weights_only=True and the allow-list; `load:` reads
    them through the safe checkpoint engine without the trust switch."""
    monkeypatch.delenv("KERPLE_TRUST_CHECKPOINT", raising=False)
    step = os.path.join(trained[1], "global_step4")
    files = sorted(f for f in os.listdir(step) if f.endswith(".pt"))
    assert files == [MODEL_FILE, "zero_pp_rank_0_mp_rank_00_optim_states.pt"]
    for f in files:
        assert isinstance(safe_torch_load(os.path.join(step, f)), dict)
    trainer = _trainer(trained, tmp_path, load=trained[1])
    assert trainer.iteration == 4
    # a NaN before the next save would name this step as what it resumed from, not "the last good"
    assert trainer.loss_watch.resumed_from == (os.path.join(trained[1], "global_step4"), 4)
    from megatron.checkpoint.deepspeed_engine import SafeLoadingCheckpointEngine

    assert isinstance(trainer.engine.checkpoint_engine, SafeLoadingCheckpointEngine)


def test_every_save_carries_a_manifest_and_a_garbled_optimizer_file_is_refused_at_resume(trained, ck, tmp_path):
    """The Trainer's save lists every file of the step (DeepSpeed's optimizer partition included)
    with the layout and the config's model keys; a resume from a step whose optimizer file lost a few
    KiB (same size, and torch.load reads it without a word) is refused naming the file, not trained on."""
    from megatron.checkpoint.manifest import read_manifest
    from tests.unit.test_checkpoint_manifest import garble

    step = os.path.join(ck, "global_step4")
    record = read_manifest(step)
    optim = "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    assert {MODEL_FILE, optim, "resolved_config.yml"} <= set(record["files"])
    assert record["files"][optim]["method"] == "zip-crc32" and record["iteration"] == 4
    assert record["layout"] == {"model_parallel_size": 1, "pipe_parallel_size": 0, "data_parallel_size": 1,
                                "zero_stage": 2, "world_size": 1}
    assert record["config"]["model"]["pos_emb"] == trained[0]["pos-emb"]
    garble(os.path.join(step, optim))
    with pytest.raises(CheckpointError) as err:
        _trainer(trained, tmp_path, load=ck)
    assert str(err.value).startswith(f"{os.path.join(step, optim)} has changed since it was saved: its data is damaged")


def test_deepspeed_fp16_loss_scaler_is_allowed(tmp_path):
    """fp16 (GPU only) pickles DeepSpeed's DynamicLossScaler into the optimizer state."""
    from deepspeed.runtime.fp16.loss_scaler import CreateLossScaler

    scaler = CreateLossScaler(torch.half, 1.0, True, {"init_scale": 2**16, "scale_window": 1000, "min_scale": 1,
                                                      "delayed_shift": 2, "consecutive_hysteresis": False})
    torch.save({"optimizer_state_dict": {"loss_scaler": scaler}}, tmp_path / "o.pt")
    back = safe_torch_load(str(tmp_path / "o.pt"))["optimizer_state_dict"]["loss_scaler"]
    assert type(back).__name__ == "DynamicLossScaler" and back.cur_scale == 2**16 and back.dtype == torch.half


def test_crafted_pickle_runs_no_code_without_trust(trained, ck, tmp_path, monkeypatch):
    monkeypatch.delenv("KERPLE_TRUST_CHECKPOINT", raising=False)
    marker = tmp_path / "marker"
    path = os.path.join(ck, "global_step4", MODEL_FILE)
    blob = torch.load(path, weights_only=False)  # the test's own file
    torch.save({**blob, "payload": _CreatesMarker(str(marker))}, path)
    reseal_manifest(os.path.dirname(path))  # a crafted step comes with a manifest of its own
    words = (path, "--trust-checkpoint", "KERPLE_TRUST_CHECKPOINT=1", "it contains io.open")
    _assert_refused(_cli("evaluate.py", "--checkpoint", ck, "--lengths", "32", "--out", str(tmp_path / "e")), *words)
    _assert_refused(_cli("generate.py", "--checkpoint", ck, "--prompt", "ab", "--max-new-tokens", "2"), *words)
    _assert_refused(_cli("tools/export_hf.py", "--checkpoint", ck, "--out", str(tmp_path / "hf")), *words)
    with pytest.raises(UnsafeCheckpointError, match="it contains io.open"):
        _trainer(trained, tmp_path, load=ck)
    from megatron.checkpoint.merge_command import main as merge

    with pytest.raises(UnsafeCheckpointError, match="it contains io.open"):  # run_cli prints it as one line
        merge(["--input", ck, "--output", str(tmp_path / "merged")])
    assert not marker.exists()
    # the explicit switch reads it with the full unpickler (and so runs its code)
    proc = _cli("evaluate.py", "--checkpoint", ck, "--lengths", "32", "--max-tokens", "64", "--out",
                str(tmp_path / "e"), "--quiet", "--trust-checkpoint")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert marker.exists()
    marker.unlink()
    monkeypatch.setenv("KERPLE_TRUST_CHECKPOINT", "1")
    assert _trainer(trained, tmp_path, load=ck).iteration == 4 and marker.exists()


def test_latest_pointing_outside_is_refused_everywhere(trained, ck, tmp_path):
    from megatron.checkpoint.load_model import load_checkpoint_model
    from megatron.checkpoint.tags import tag_dir_of

    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(os.path.join(ck, "global_step4"), elsewhere / "global_step40")
    latest = os.path.join(ck, "latest")
    with open(latest, "w") as f:
        f.write("../elsewhere/global_step40")
    for load in (lambda: load_checkpoint_model(ck), lambda: tag_dir_of(ck), lambda: _trainer(trained, tmp_path, load=ck)):
        with pytest.raises(CheckpointError, match=f"{latest} names checkpoint '../elsewhere/global_step40', which is "
                                                  "not the plain name"):
            load()
    _assert_refused(_cli("evaluate.py", "--checkpoint", ck, "--out", str(tmp_path / "e")), latest,
                    "not the plain name of a step directory", "--iteration")


def test_nonfinite_weights_are_refused_unless_allowed(trained, ck, tmp_path):
    from megatron.checkpoint.load_model import load_checkpoint_model

    path = os.path.join(ck, "global_step4", MODEL_FILE)
    blob = torch.load(path, weights_only=False)
    name = "layers.1.attention.dense.weight"
    blob["module"][name][0, 0] = float("nan")
    torch.save(blob, path)
    reseal_manifest(os.path.dirname(path))  # saved that way by a run that diverged
    _assert_refused(_cli("evaluate.py", "--checkpoint", ck, "--out", str(tmp_path / "e")), path,
                    f"module.{name}", "--allow-nonfinite")
    with pytest.raises(CheckpointError, match=f"{path} holds non-finite values .*module.{name}.*allow-nonfinite-weights"):
        _trainer(trained, tmp_path, load=ck)
    model, _, _ = load_checkpoint_model(ck, allow_nonfinite=True)
    assert torch.isnan(model.state_dict()[name]).any()
    assert _trainer(trained, tmp_path, load=ck, allow_nonfinite_weights=True).iteration == 4
    proc = _cli("tools/export_hf.py", "--checkpoint", ck, "--out", str(tmp_path / "hf"), "--no-tokenizer",
                "--allow-nonfinite")
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_failed_save_says_disk_full_and_keeps_latest(trained, tmp_path, monkeypatch):
    import megatron.checkpoint.writer as writer

    save = str(tmp_path / "save")
    trainer = _trainer(trained, tmp_path, save=save, load=None, save_interval=2)
    real = trainer.engine.save_checkpoint

    def fails_second_time(save_dir, tag, **kw):
        if tag.startswith("global_step4"):  # a partial file, then the error torch.save gives on ENOSPC
            os.makedirs(os.path.join(save_dir, tag), exist_ok=True)
            with open(os.path.join(save_dir, tag, MODEL_FILE), "wb") as f:
                f.write(b"PK\x03\x04 partial")
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 320 vs 258\n"
                               "basic_ios::clear: iostream error")
        return real(save_dir, tag, **kw)

    monkeypatch.setattr(trainer.engine, "save_checkpoint", fails_second_time)
    monkeypatch.setattr(writer, "free_bytes", lambda path: 3 << 20)
    stale = os.path.join(save, "latest.tmp999999999")  # left by a killed writer (no such pid)
    with pytest.raises(CheckpointSaveError) as err:
        os.makedirs(save, exist_ok=True)  # the trainer made it already (its disk-space check)
        open(stale, "w").close()
        trainer.train()
    msg = str(err.value)
    assert msg.startswith(f"could not save checkpoint global_step4 into {save}: the disk is full (")
    assert f"{os.path.join(save, 'latest')} still names global_step2" in msg and "3 MiB free" in msg
    assert err.value.exit_code == 1
    left = sorted(f for f in os.listdir(save) if not f.endswith(".py"))  # DeepSpeed adds zero_to_fp32.py
    assert left == ["global_step2", "latest"]  # the partial directory and the stale tmp file are gone
    assert read_latest(save) == "global_step2"


def test_evaluation_retries_a_step_pruned_while_reading(ck, monkeypatch):
    import megatron.checkpoint.safe_load as safe_load
    from megatron.checkpoint.load_model import LOAD_ATTEMPTS, load_checkpoint_model
    from megatron.checkpoint.tags import write_latest

    write_latest(ck, "global_step2")
    template = os.path.join(os.path.dirname(ck), "template")
    shutil.copytree(os.path.join(ck, "global_step4"), template)
    real = safe_load.read_checkpoint_file
    pruned = []

    def training_saves_meanwhile(path, *a, **kw):
        """`latest` was read; before the first file is, training saves a newer step and prunes this one."""
        tag_dir = os.path.dirname(path)
        if len(pruned) < budget:
            newer = f"global_step{6 + 2 * len(pruned)}"
            shutil.copytree(template, os.path.join(ck, newer))
            write_latest(ck, newer)
            shutil.rmtree(tag_dir)
            pruned.append(os.path.basename(tag_dir))
        return real(path, *a, **kw)

    monkeypatch.setattr(safe_load, "read_checkpoint_file", training_saves_meanwhile)
    budget = 1
    _, _, client = load_checkpoint_model(ck)
    assert pruned == ["global_step2"] and client["iteration"] == 4  # the copy of step 4 saved as step 6
    budget = 1 + LOAD_ATTEMPTS
    with pytest.raises(CheckpointError, match=r"the steps `latest` named \(global_step6, global_step8, global_step10\) "
                                              r"were deleted while they were being read, 3 times in a row"):
        load_checkpoint_model(ck)
    budget = len(pruned) + 1  # an explicit step is not swapped for a newer one
    assert read_latest(ck) == "global_step12"
    with pytest.raises(CheckpointError, match=r"global_step12 was deleted while it was being read.*--iteration"):
        load_checkpoint_model(ck, "global_step12")
    with pytest.raises(CheckpointError, match=r"global_step99 does not exist; pass --iteration"):
        load_checkpoint_model(ck, "global_step99")


def test_zero3_finetune_reads_through_the_safe_reader(tmp_path, token_dataset, monkeypatch):
    """ZeRO-3 without optimizer states: DeepSpeed consolidates through zero_to_fp32, which bypasses
    its checkpoint engine; the files still go through the safe reader, inside the requested step."""
    import megatron.checkpoint.safe_load as safe_load
    from megatron.training.trainer import Trainer

    ck = str(tmp_path / "ck")
    conf = train_config_dict(tmp_path, token_dataset, train_iters=2, save=ck, save_interval=1, eval_iters=1,
                             zero_optimization={"stage": 3})
    Trainer(load_config([write_yaml(tmp_path / "z3.yml", conf)])).train()
    read = []
    real = safe_load.read_checkpoint_file
    monkeypatch.setattr(safe_load, "read_checkpoint_file", lambda path, *a, **kw: read.append(path) or real(path, *a, **kw))
    tune = hyphenate({**conf, "load": ck, "save": None, "finetune": True, "run-dir": str(tmp_path / "tune")})
    assert Trainer(load_config([write_yaml(tmp_path / "tune.yml", tune)])).iteration == 0
    assert any("optim_states" in p for p in read) and all("/global_step2/" in p for p in read)
    with pytest.raises(CheckpointError, match="outside the checkpoint being loaded .*global_step1"):
        Trainer(load_config([write_yaml(tmp_path / "tune1.yml", {**tune, "iteration": 1})]))
