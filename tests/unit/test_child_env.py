"""Child train/deepy processes of the suite keep the parent's PYTHONPATH after the repository: on the
GPU machine deepspeed and megatron-core come from the device bundle's PYTHONPATH (/tmp/site), and a
child that lost it failed with "No module named 'deepspeed'" (H200, 2026-11-27: 5 GPU tests)."""
import os

from tests.conftest import ROOT
from tests.integration.fault_helpers import child_env


def test_child_keeps_the_parents_python_path_after_the_repository(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/tmp/site", ROOT, "/opt/extra"]))
    assert child_env()["PYTHONPATH"].split(os.pathsep) == [ROOT, "/tmp/site", "/opt/extra"]


def test_child_without_a_parent_path_gets_the_repository(monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert child_env()["PYTHONPATH"] == ROOT


def test_accelerator_pin_and_process_group_variables(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    assert child_env()["DS_ACCELERATOR"] == "cpu" and "RANK" not in child_env()
    assert "DS_ACCELERATOR" not in child_env(accelerator=None)  # the GPU tests: DeepSpeed picks the GPU
