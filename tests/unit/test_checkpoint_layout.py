"""megatron/checkpoint/: the one place that decides a step directory's layout, and its place below
training/, evaluation/ and interop/."""
import ast
import os
import subprocess
import sys

import pytest

from megatron.checkpoint.layout import detect_layout, is_neox, layer_files, shard_files
from megatron.checkpoint.tags import step_of, tag_for, tag_or_latest
from tests.conftest import ROOT

LAYOUTS = {
    "ours": ["resolved_config.yml", "mp_rank_00_model_states.pt"],
    "ours-tp": ["resolved_config.yml", "mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt"],
    "ours-pipeline": ["resolved_config.yml", "mp_rank_00_model_states.pt", "layer_00-model_00-model_states.pt"],
    "ours-zero3": ["resolved_config.yml", "zero_pp_rank_0_mp_rank_00_model_states.pt"],
    "neox-pipeline": ["mp_rank_00_model_states.pt", "layer_00-model_00-model_states.pt",
                      "layer_02-model_01-model_states.pt"],
    "neox-sequential": ["mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt"],
}


def _step(tmp_path, names):
    step = tmp_path / "ck" / "global_step3"
    step.mkdir(parents=True)
    for name in names:
        (step / name).write_bytes(b"")
    (tmp_path / "ck" / "latest").write_text("global_step3")
    return str(step)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_every_layout_is_detected_in_one_place(tmp_path, layout):
    step = _step(tmp_path, LAYOUTS[layout])
    assert detect_layout(step) == layout
    assert is_neox(layout) == layout.startswith("neox")


def test_file_listing(tmp_path):
    step = _step(tmp_path, LAYOUTS["neox-pipeline"] + ["mp_rank_01_model_states.pt", "layer_x-model_states.pt"])
    assert sorted(layer_files(step)) == [(0, 0), (1, 2)]
    assert [os.path.basename(p) for p in shard_files(step)] == ["mp_rank_00_model_states.pt",
                                                                "mp_rank_01_model_states.pt"]
    os.remove(os.path.join(step, "mp_rank_00_model_states.pt"))
    with pytest.raises(ValueError, match=r"holds tensor-parallel shards \[1\]; expected mp_rank_00"):
        shard_files(step)


def test_tags():
    assert tag_for(40) == "global_step40" and step_of("global_step40") == 40
    assert step_of("global_step40.incomplete") is None and step_of("latest") is None
    assert tag_or_latest(None) is None and tag_or_latest(7) == "global_step7"


def test_checkpoint_package_imports_nothing_above_it():
    """training/, evaluation/ and interop/ import megatron.checkpoint, never the reverse."""
    pkg = os.path.join(ROOT, "megatron", "checkpoint")
    above = ("megatron.training", "megatron.evaluation", "megatron.interop")
    found = []
    for name in sorted(os.listdir(pkg)):
        if name.endswith(".py"):
            for node in ast.walk(ast.parse(open(os.path.join(pkg, name)).read())):
                mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                        else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                found += [f"{name}: {m}" for m in mods if m.startswith(above)]
    assert found == []


def test_convert_refuses_our_own_layout(tmp_path):
    _step(tmp_path, LAYOUTS["ours"])
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "convert_neox_checkpoint.py"),
                           "--input", str(tmp_path / "ck"), "--output", str(tmp_path / "out")],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "global_step3 is in this stack's own layout, not NeoX's: it needs no conversion" in proc.stderr
    assert not os.path.exists(tmp_path / "out")
