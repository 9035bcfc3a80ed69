"""The Checkpointer answers "latest" and "has step N" for everyone (issue 57): the trainer and the
process-group setup read no checkpoint tags themselves."""
import ast
import os
from pathlib import Path

from megatron.checkpoint.tags import write_latest
from megatron.training.checkpoint import Checkpointer

REPO = Path(__file__).resolve().parents[2]


def test_latest_and_has_step(tiny_config, tmp_path):
    save = tmp_path / "ck"
    ckpt = Checkpointer(tiny_config(save=str(save), save_interval=4), 64, is_rank0=False)
    assert ckpt.latest() is None and "no checkpoint in" in Checkpointer.resume_note(str(save))
    os.makedirs(save / "global_step4")
    write_latest(str(save), "global_step4")
    assert ckpt.latest() == os.path.join(str(save), "global_step4")
    assert ckpt.has_step(4) and not ckpt.has_step(8)
    assert Checkpointer.resume_note(str(save)).endswith("names global_step4: run the same command again to resume from it")
    assert Checkpointer.resume_note(None).startswith("nothing was saved")


def test_the_trainer_and_process_setup_read_no_tags():
    readers = [REPO / "megatron" / "training" / "trainer.py", *sorted((REPO / "megatron" / "process").glob("*.py"))]
    found = []
    for path in readers:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "megatron.checkpoint.tags":
                found.append(f"{path.relative_to(REPO)}: {', '.join(a.name for a in node.names)}")
    assert not found, "read checkpoint tags beside the Checkpointer:\n" + "\n".join(found)
