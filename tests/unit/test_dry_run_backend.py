"""The dry run decides the attention backend as training does (issue 54 item 4): for every scheme and
backend on this machine's CPU, deepy.py's check refuses exactly the pairs the trainer's model refuses,
and names the same backend where both accept."""
import os
import subprocess
import sys

import pytest
import torch

from megatron.attention.registry import backend_classes
from megatron.config import load_config
from megatron.config.errors import ConfigError
from megatron.launch.launcher import training_backend
from megatron.model import GPTModel
from megatron.positional.registry import scheme_names
from tests.conftest import ROOT, TINY_MODEL, write_yaml


def trainer_decision(cfg) -> str:
    """What the trainer's model resolves (Trainer: GPTModel in train mode, .backend(device, dtype))."""
    model = GPTModel(cfg.model, 128).train()
    try:
        return model.backend(torch.device("cpu"), cfg.precision.torch_dtype).name
    except ValueError:
        return "refused"


@pytest.mark.parametrize("backend", ["auto", *backend_classes()])
def test_the_dry_run_refuses_what_training_refuses_for_every_scheme(tmp_path, backend):
    for scheme in scheme_names():
        path = write_yaml(tmp_path / f"{scheme}.yml", {**TINY_MODEL, "pos-emb": scheme, "attention-backend": backend,
                                                       "device": "cpu"})
        try:
            cfg = load_config([path])
        except ConfigError:
            continue  # a scheme whose own keys this tiny model does not satisfy: refused by the loader alike
        try:
            said = training_backend(cfg).split("backend ")[1].split(" ")[0]
        except ConfigError as e:
            assert "training would refuse it on this machine" in str(e)
            said = "refused"
        assert said == trainer_decision(cfg), (scheme, backend)


def test_deepy_dry_run_refuses_fire_on_flex_in_one_message(tmp_path):
    cfg = write_yaml(tmp_path / "fire.yml", {**TINY_MODEL, "pos-emb": "fire", "attention-backend": "flex",
                                             "device": "cpu"})
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "deepy.py"), "--dry-run", "train.py", cfg],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "attention-backend = 'flex'" in proc.stderr and "cannot run pos-emb 'fire' on cpu" in proc.stderr
    assert len(proc.stderr.splitlines()) <= 30
