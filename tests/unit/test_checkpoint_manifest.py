"""The checkpoint manifest (megatron/checkpoint/manifest.py) on tiny TP=2 checkpoints built in this
process: a missing shard, a changed file, a config edited to another scheme, a file that is not a
checkpoint and one without `module` are each refused in one message naming the file; a step saved
before manifests existed loads with one note."""
import os
import shutil
import struct
import zipfile

import pytest
import torch

from megatron.checkpoint.client import model_args
from megatron.checkpoint.errors import CheckpointError
from megatron.checkpoint.manifest import MANIFEST, model_keys, read_manifest, run_layout, write_manifest
from megatron.checkpoint.merge_command import main as merge
from megatron.checkpoint.reader import read_tp1_state
from megatron.model import GPTModel
from megatron.parallel.layout import REPLICATED, group_shards
from megatron.parallel.merge import merge_plan

STEP = "global_step2"


def _split(state: dict, model_cfg, tp: int) -> list[dict]:
    """A TP=1 state dict the way `tp` ranks hold it (the inverse of megatron/parallel/merge.py)."""
    plan, shards = merge_plan(model_cfg), [{} for _ in range(tp)]
    for key, full in state.items():
        dim, groups = plan.dim_of(key), plan.groups_of(key)
        if dim is REPLICATED:
            parts = [full] * tp
        else:
            parts = (group_shards(full, groups, tp, dim) if groups else full).chunk(tp, dim=dim)
        for r in range(tp):
            shards[r][key] = parts[r].clone()
    return shards


@pytest.fixture
def tp2(tiny_config, tmp_path):
    """(checkpoint dir, TP=1 state): a TP=2 step written as the Checkpointer writes one, manifest last."""
    cfg = tiny_config(model_parallel_size=2)
    torch.manual_seed(0)
    state = GPTModel(cfg.model, 128).state_dict()
    ck = tmp_path / "ck"
    tag_dir = ck / STEP
    os.makedirs(tag_dir)
    client = {"iteration": 2, "args": model_args(cfg, 128), "config": cfg.to_flat_dict()}
    for r, shard in enumerate(_split(state, cfg.model, 2)):
        torch.save({**client, "module": shard, "optimizer": None}, tag_dir / f"mp_rank_{r:02d}_model_states.pt")
    cfg.save(tag_dir / "resolved_config.yml")
    write_manifest(str(tag_dir), STEP, run_layout(cfg, 2), model_keys(cfg), 2)
    (ck / "latest").write_text(STEP)
    return str(ck), state


def _refusal(fn) -> str:
    with pytest.raises(CheckpointError) as e:
        fn()
    return str(e.value)


def test_a_missing_shard_is_refused_by_merge_naming_it(tp2, tmp_path):
    ck, state = tp2
    assert merge(["--input", ck, "--output", str(tmp_path / "whole")]) == 0
    merged = read_tp1_state(str(tmp_path / "whole")).state
    assert merged["word_embeddings.weight"].shape == state["word_embeddings.weight"].shape
    assert read_manifest(os.path.join(tmp_path, "whole", STEP))["layout"]["model_parallel_size"] == 1
    os.remove(os.path.join(ck, STEP, "mp_rank_01_model_states.pt"))
    msg = _refusal(lambda: merge(["--input", ck, "--output", str(tmp_path / "half")]))
    assert f"checkpoint {os.path.join(ck, STEP)} does not match its manifest" in msg
    assert "mp_rank_01_model_states.pt is missing" in msg and "model-parallel-size 2" in msg
    assert not os.path.exists(tmp_path / "half")
    # saved before manifests existed: rank 0's saved model-parallel-size still names what is missing
    os.remove(os.path.join(ck, STEP, MANIFEST))
    msg = _refusal(lambda: merge(["--input", ck, "--output", str(tmp_path / "half")]))
    assert "model-parallel-size 2 but holds 1" in msg and "mp_rank_01_model_states.pt is missing" in msg


def garble(path: str, nbytes: int = 4096) -> None:
    """Overwrite `nbytes` in the middle of the largest tensor's data: same size, and torch.load
    reads the file without a word (it does not check the zip's CRC-32s)."""
    with zipfile.ZipFile(path) as zf:
        # a tensor's storage (`<archive>/data/<n>`), never the pickle, which a read would fail on
        info = max((i for i in zf.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = struct.unpack("<HH", f.read(4))
        start = info.header_offset + 30 + name_len + extra_len
        f.seek(start + max(0, info.file_size - nbytes) // 2)
        f.write(os.urandom(min(nbytes, info.file_size)))


def test_a_garbled_file_is_refused_before_it_is_read(tp2):
    ck, _ = tp2
    path = os.path.join(ck, STEP, "mp_rank_00_model_states.pt")
    garble(path)
    torch.load(path, weights_only=True)  # what a read without the manifest took as it is
    msg = _refusal(lambda: read_tp1_state(ck))
    assert msg.startswith(f"{path} has changed since it was saved: its data is damaged (Bad CRC-32")
    assert "copy it again from where it was saved, or load another step" in msg


def test_a_config_edited_to_another_scheme_is_refused(tp2, capsys):
    ck, _ = tp2
    resolved = os.path.join(ck, STEP, "resolved_config.yml")
    text = open(resolved).read()
    with open(resolved, "w") as f:  # same parameter names and shapes: the weights would load silently
        f.write(text.replace("pos_emb: kerple_log", "pos_emb: kerple_power_ap_"))
    msg = _refusal(lambda: read_tp1_state(ck))
    assert "resolved_config.yml no longer describes the weights (pos-emb: weights built with 'kerple_log', " \
           "resolved_config.yml now says 'kerple_power_ap_')" in msg
    assert "-o KEY=VALUE" in msg
    with open(resolved, "w") as f:  # an edit outside the model keys is accepted, with a note
        f.write(text.replace("log_interval: 100", "log_interval: 7"))
    assert read_tp1_state(ck).cfg.logging.log_interval == 7
    assert "edited since the save, but not in the keys that describe the weights" in capsys.readouterr().out


def test_a_file_that_is_no_checkpoint_is_never_answered_with_trust(tp2):
    ck, _ = tp2
    tag_dir = os.path.join(ck, STEP)
    os.remove(os.path.join(tag_dir, MANIFEST))  # as a step saved before manifests: the read itself must tell
    path = os.path.join(tag_dir, "mp_rank_01_model_states.pt")
    with open(path, "w") as f:
        f.write("model: not really\n")
    msg = _refusal(lambda: read_tp1_state(ck))
    assert msg.startswith(f"{path} is not a PyTorch checkpoint file (a text file starting with 'model: not really")
    assert "trust" not in msg
    torch.save({"weights": torch.zeros(2)}, path)  # a torch file, not a model-states one
    msg = _refusal(lambda: read_tp1_state(ck))
    assert f"{path} is a torch file but not a checkpoint file: it has no `module` entry (its keys: 'weights')" in msg


def test_extra_shard_is_refused_and_a_step_without_manifest_loads_with_one_note(tp2, capsys):
    ck, state = tp2
    tag_dir = os.path.join(ck, STEP)
    shutil.copy(os.path.join(tag_dir, "mp_rank_01_model_states.pt"), os.path.join(tag_dir, "mp_rank_02_model_states.pt"))
    assert "mp_rank_02_model_states.pt is not part of it" in _refusal(lambda: read_tp1_state(ck))
    os.remove(os.path.join(tag_dir, "mp_rank_02_model_states.pt"))
    os.remove(os.path.join(tag_dir, MANIFEST))
    merged = read_tp1_state(ck).state
    assert all(torch.equal(merged[k], state[k]) for k in state)
    notes = [line for line in capsys.readouterr().out.splitlines() if MANIFEST in line]
    assert notes == [f"[checkpoint] note: {tag_dir} has no {MANIFEST} (saved before checkpoints carried one, or by "
                     "NeoX): loaded without checking its files for missing or changed ones"]
