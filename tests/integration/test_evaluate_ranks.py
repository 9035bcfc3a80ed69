"""evaluate.py's sweep spread over two local processes (megatron/evaluation/spread.py): started with
torch.distributed's variables and with Slurm's, each rank scores about half of each length's
windows and rank 0 writes one eval.json equal to one process's; a refusal ends both ranks with one
message and changes nothing; `deepy.py evaluate.py CONFIG` without a checkpoint writes nothing."""
import csv
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from megatron.config import load_config
from megatron.evaluation import sweep as evaluate
from megatron.process.distributed import free_port
from tests.conftest import ROOT, TINY_MODEL, train_config_dict, write_yaml

LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS",
               "SLURM_LOCALID", "SLURM_STEP_NUM_TASKS")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from megatron.training.trainer import Trainer
    from tests.conftest import write_token_dataset

    tmp = tmp_path_factory.mktemp("ranks")
    prefix = write_token_dataset(str(tmp / "tiny_text_document"))
    ck = str(tmp / "run" / "checkpoints")
    data = train_config_dict(tmp, prefix, train_iters=2, save=ck, save_interval=2)
    Trainer(load_config([write_yaml(tmp / "train.yml", data)])).train()
    return ck, prefix


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def two_ranks(argv: list[str], slurm: bool = False, command: tuple = ("evaluate.py",)) -> list[subprocess.CompletedProcess]:
    """evaluate.py (or `command`) as ranks 0 and 1 of one launch, as DeepSpeed's launcher (or srun) starts them."""
    port = free_port()
    procs = []
    for rank in (0, 1):
        env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1", KERPLE_EVAL_PLOTS="0")
        env.update(dict(SLURM_PROCID=str(rank), SLURM_NTASKS="2", SLURM_STEP_NUM_TASKS="2", SLURM_LOCALID=str(rank)) if slurm
                   else dict(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank)))
        procs.append(subprocess.Popen([sys.executable, *command, *argv], env=env, cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        # rank 1 once rank 0's store listens: on this test machine two ranks that reach the rendezvous
        # in the same instant sometimes never meet (torch's TCPStore; a launcher's ranks start seconds apart)
        deadline = time.time() + 60
        while rank == 0 and not _listening(port) and procs[0].poll() is None and time.time() < deadline:
            time.sleep(0.1)
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


def _positionwise(path) -> list[float]:
    with open(path) as f:
        return [float(row["loss"]) for row in csv.DictReader(f)]


def _same(a: float, b: float) -> bool:
    return a == pytest.approx(b, rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("flags, slurm", [
    # shuffled windows, batches of 2, blockwise causal attention, long documents only: torch's variables
    (["--lengths", "32,64", "--max-windows", "7", "--batch-size", "2", "--blockwise-causal", "--min-doc-tokens", "40"],
     False),
    # strided: Slurm's variables
    (["--lengths", "32,64", "--stride", "16", "--max-tokens", "200"], True),
    # windowed attention over the leading tokens, with a checkpoint-config override
    (["--lengths", "32,64", "--window", "16", "--window-order", "contiguous", "--max-tokens", "320",
      "-o", "attention-backend=sdpa"], False),
], ids=["blockwise-torch-env", "strided-slurm-env", "windowed-contiguous"])
def test_two_ranks_write_one_process_result(tmp_path, checkpoint, flags, slurm):
    ck, _ = checkpoint
    assert evaluate.main(["--checkpoint", ck, "--out", str(tmp_path / "one"), "--quiet", *flags]) == 0
    ranks = two_ranks(["--checkpoint", ck, "--out", str(tmp_path / "two"), "--quiet", *flags], slurm=slurm)
    assert [r.returncode for r in ranks] == [0, 0], ranks[0].stderr + ranks[1].stderr
    assert ranks[1].stdout == "" and "Traceback" not in ranks[0].stderr + ranks[1].stderr  # rank 0 speaks
    one, two = (json.loads((tmp_path / d / "eval.json").read_text()) for d in ("one", "two"))
    assert one["ranks"] == 1 and two["ranks"] == 2
    for a, b in zip(one["results"], two["results"], strict=True):
        assert _same(a["ppl"], b["ppl"]) and _same(a["loss"], b["loss"]) and a["tokens"] == b["tokens"]
        assert "windows_per_rank" not in a  # one process's record keeps its keys
        counts = b["windows_per_rank"]
        assert len(counts) == 2 and sum(counts) == a["windows"] == b["windows"] and abs(counts[0] - counts[1]) <= 1
        assert all(_same(x, y) for x, y in zip(one["positionwise"][str(a["length"])]["loss"],
                                                two["positionwise"][str(b["length"])]["loss"], strict=True))
    assert all(_same(x, y) for x, y in zip(_positionwise(tmp_path / "one" / "positionwise.csv"),
                                            _positionwise(tmp_path / "two" / "positionwise.csv"), strict=True))
    assert sorted(os.listdir(tmp_path / "two")) == sorted(os.listdir(tmp_path / "one"))  # nothing else, no lock left


def test_refusal_ends_both_ranks_with_one_message(tmp_path, checkpoint):
    ck, _ = checkpoint
    out = tmp_path / "out"
    argv = ["--checkpoint", ck, "--out", str(out), "--lengths", "32", "--max-windows", "2", "--quiet"]
    assert evaluate.main(argv) == 0
    before = {p: (out / p).read_bytes() for p in os.listdir(out)}
    ranks = two_ranks(argv)
    assert [r.returncode for r in ranks] == [2, 2]
    said = ranks[0].stdout + ranks[0].stderr + ranks[1].stdout + ranks[1].stderr
    assert said.count("already holds the results of an earlier evaluation") == 1 and "--overwrite" in said
    assert "Traceback" not in said and ranks[1].stderr == ""
    assert {p: (out / p).read_bytes() for p in os.listdir(out)} == before


@pytest.mark.parametrize("keys, said", [
    ({}, "the config sets no `load` (nor `save`)"),
    ({"save": "run/checkpoints", "save-interval": 2}, "is not a directory: no checkpoint to evaluate"),
], ids=["no-load-nor-save", "save-not-trained-yet"])
def test_deepy_evaluate_without_a_checkpoint_writes_nothing(tmp_path, monkeypatch, capsys, keys, said):
    from megatron import errors
    from megatron.launch import launcher

    keys = {k: str(tmp_path / v) if k == "save" else v for k, v in keys.items()}
    config = write_yaml(tmp_path / "c.yml", dict(TINY_MODEL, **{"run-dir": str(tmp_path / "run"), "device": "cpu"},
                                                   **keys))
    monkeypatch.delenv(errors.DEBUG_ENV, raising=False)
    monkeypatch.chdir(ROOT)  # deepy.py names evaluate.py relative to the repository
    monkeypatch.setattr(sys, "argv", ["deepy.py", "evaluate.py", config, "--lengths", "32"])
    with pytest.raises(SystemExit) as e:
        errors.run_cli(launcher.main, "deepy.py")
    err = capsys.readouterr().err
    assert e.value.code == 2 and said in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()  # no resolved config, no eval/ directory


def test_deepy_evaluate_writes_beside_the_run_and_leaves_its_config(tmp_path, checkpoint, monkeypatch, capsys):
    """One process (no num-gpus, no hostfile): evaluate.py runs in deepy.py's process on the config's
    checkpoint; its resolved config goes to <run_dir>/eval/, the run's own is left as it was."""
    from megatron import errors
    from megatron.launch import launcher

    ck, prefix = checkpoint
    run = tmp_path / "run"
    run.mkdir()
    (run / "resolved_config.yml").write_text("the run's own\n")
    config = write_yaml(tmp_path / "c.yml", train_config_dict(tmp_path, prefix, load=ck, run_dir=str(run)))
    monkeypatch.delenv(errors.DEBUG_ENV, raising=False)
    monkeypatch.chdir(ROOT)
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["deepy.py", "evaluate.py", config, "--lengths", "32", "--max-windows", "3",
                                      "--out", str(out), "--quiet"])
    with pytest.raises(SystemExit) as e:
        errors.run_cli(launcher.main, "deepy.py")
    assert e.value.code == 0, capsys.readouterr().err
    rec = json.loads((out / "eval.json").read_text())
    assert rec["checkpoint"] == os.path.abspath(ck) and rec["ranks"] == 1 and rec["results"][0]["windows"] == 3
    assert (run / "eval" / "resolved_config.yml").is_file() and (run / "resolved_config.yml").read_text() == "the run's own\n"


FAILS_ON_RANK_1 = """
from megatron.errors import UserError, run_cli
from megatron.evaluation.spread import EvalGroup, quiet_peers
from megatron.process.ranks import launch_ranks

def fail_on_rank_1(rank):
    if rank == 1:
        raise UserError("length 64: the windows of this rank are not finite")

def run(argv):
    import torch
    group = EvalGroup.start(launch_ranks(), torch.device("cpu"))
    try:
        group.agree(fail_on_rank_1, group.rank)
        print("not reached", flush=True)
    finally:
        group.close()

run_cli(lambda: quiet_peers(run), "evaluate.py")
"""


def test_a_failure_on_rank_1_ends_both_ranks_said_once_by_rank_0():
    ranks = two_ranks([], command=("-c", FAILS_ON_RANK_1))
    assert [r.returncode for r in ranks] == [2, 2]
    said = "".join(r.stdout + r.stderr for r in ranks)
    assert said.count("the windows of this rank are not finite") == 1 and "not reached" not in said
    assert "error: rank 1: length 64" in ranks[0].stderr and "Traceback" not in said
