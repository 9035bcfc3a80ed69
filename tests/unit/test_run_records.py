"""Run records (a finished matrix run reduced to committable files), the convergence measure read
off them, and the report built from them without checkpoints."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from megatron.config import load_config
from megatron.evaluation.kernels import learned_kernels
from megatron.process.metrics_file import metrics_path, read_metrics
from study.convergence import drift_rows, head_series, over_target, records_to_draw, relative_tail_change
from study.experiments import Run
from study.run_record import record_complete, trajectory_from_metrics, write_record
from tests.conftest import ROOT, train_config_dict, write_yaml


def train_run(tmp_path, token_dataset, pos_emb="kerple_log", iters=6, seed=1234):
    from megatron.training.trainer import Trainer

    run_dir = tmp_path / f"run_{pos_emb}_{seed}"
    ck = str(run_dir / "checkpoints")
    data = train_config_dict(tmp_path, token_dataset, train_iters=iters, save=ck, save_interval=iters,
                             pos_emb=pos_emb, run_dir=str(run_dir), seed=seed)
    cfg_path = write_yaml(tmp_path / f"{pos_emb}_{seed}.yml", data)
    Trainer(load_config([cfg_path])).train()
    return Run(f"{pos_emb}_tiny_{seed}", pos_emb, "tiny", seed, cfg_path, str(run_dir))


def fake_eval(path, pos_emb, seed, window=None, lengths=(16, 32)):
    os.makedirs(path, exist_ok=True)
    blob = {"schema": "kerple-eval/1", "pos_emb": pos_emb, "window": window, "dataset": "tiny", "seed": seed,
            "train_length": 16, "results": [{"length": L, "ppl": 3.0 + seed % 7 + L / 100} for L in lengths],
            "positionwise": {}}
    with open(os.path.join(path, "eval.json"), "w") as f:
        json.dump(blob, f)
    return path


def test_trainer_logs_each_heads_clamped_value_every_step(tmp_path, token_dataset):
    import torch

    run = train_run(tmp_path, token_dataset)
    rows = [r for r in read_metrics(metrics_path(run.run_dir)) if r.get("kind") == "train"]
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4, 5, 6]
    state = torch.load(f"{run.checkpoints}/global_step6/mp_rank_00_model_states.pt", weights_only=False)["module"]
    p = next(v for k, v in state.items() if k.endswith("bias_p")).flatten().clamp_min(1e-2).tolist()
    assert [rows[-1][f"bias_p_h{h}"] for h in range(4)] == pytest.approx(p, rel=1e-6)
    assert "bias_p_h4" not in rows[-1]  # four heads


def test_relative_tail_change_is_the_stated_formula():
    steps = list(range(0, 101, 10))  # T = 100, 0.8 T = 80
    values = [5.0] * 8 + [2.0, 2.5, 4.0]  # x(80) = 2.0, x(100) = 4.0
    assert relative_tail_change(steps, values) == pytest.approx(abs(4.0 - 2.0) / 4.0)
    assert relative_tail_change(steps, values, tail=0.1) == pytest.approx(abs(4.0 - 2.5) / 4.0)
    assert relative_tail_change([1, 2, 3], [1.0, 1.0, 1.0]) == 0.0
    with pytest.raises(ValueError, match="tail"):
        relative_tail_change(steps, values, tail=1.5)


def test_head_series_and_drift_rows():
    traj = {"iteration": [10, 20, 30, 40, 50], "lm_loss": [5, 4, 3, 2, 1],
            "bias_p_h0": [1, 1, 1, 1, 2], "bias_p_h1": [1, 1, 1, 1, 1], "bias_a_h0": [3, 3, 3, 3, 3]}
    assert head_series(traj) == {"bias_p": {0: [1, 1, 1, 1, 2], 1: [1, 1, 1, 1, 1]}, "bias_a": {0: [3, 3, 3, 3, 3]}}
    rows = drift_rows([{"dataset": "d", "scheme": "kerple_log", "trajectory": traj}])
    by = {r["parameter"]: r for r in rows}
    assert by["bias_p"]["max"] == pytest.approx(0.5) and by["bias_p"]["median"] == pytest.approx(0.25)
    assert by["bias_p"]["heads"] == 2 and by["bias_a"]["max"] == 0.0
    assert by["bias_p"]["over_target"] == 1 and by["bias_a"]["over_target"] == 0  # 50% > 5%, 0% not


def test_the_trajectory_plot_draws_the_lowest_seed_and_every_drift_exception():
    still = {"iteration": [10, 20, 30, 40, 50], "bias_p_h0": [1, 1, 1, 1, 1]}
    moving = {"iteration": [10, 20, 30, 40, 50], "bias_p_h0": [1, 1, 1, 1, 2]}  # 50% over the last 20%
    recs = [{"label": "kerple_log", "seed": s, "trajectory": t}
            for s, t in ((3, moving), (1, still), (2, still), (4, moving))]
    recs.append({"label": "alibi", "seed": 1, "trajectory": {"iteration": [10]}})
    drawn = records_to_draw(recs)
    assert [(r["label"], r["seed"]) for r in drawn] == [("alibi", 1), ("kerple_log", 1), ("kerple_log", 3),
                                                         ("kerple_log", 4)]
    assert over_target(recs[0]) == {"bias_p": {0: 0.5}}


def test_write_record_then_report_from_records_alone(tmp_path, token_dataset):
    from study import make_report

    records = tmp_path / "records"
    for pos_emb, seed in (("kerple_log", 1), ("kerple_log", 2), ("alibi", 1), ("rotary", 1)):
        run = train_run(tmp_path, token_dataset, pos_emb, seed=seed)
        full = fake_eval(os.path.join(run.run_dir, "eval"), pos_emb, seed)
        window = fake_eval(os.path.join(run.run_dir, "eval_window"), pos_emb, seed, window=16) \
            if pos_emb == "kerple_log" else None
        out = write_record(str(records / run.name), run, full, window, metrics_path(run.run_dir), 32, 12.0, every=2)
        assert record_complete(out)
    klog = records / "kerple_log_tiny_1"
    assert sorted(os.listdir(klog)) == ["eval.json", "eval_window.json", "kernel.json", "record.json",
                                        "trajectory.json"]
    assert sorted(os.listdir(records / "rotary_tiny_1")) == ["eval.json", "record.json", "trajectory.json"]
    traj = json.loads((klog / "trajectory.json").read_text())
    assert traj["iteration"] == [2, 4, 6] and len(traj["bias_a_h3"]) == 3 and "lm_loss" in traj
    meta = json.loads((klog / "record.json").read_text())
    assert meta["steps"] == 6 and meta["scheme"] == "kerple_log" and meta["seed"] == 1
    assert meta["train_length"] == 16 and "label" not in meta  # the train length comes from the evaluation
    assert meta["trained_on"] == [{"from_step": 0, "device": f"cpu ({torch.get_num_threads()} threads)",
                                   "processes": 1, "torch": torch.__version__}]
    kernel = json.loads((klog / "kernel.json").read_text())
    expected = learned_kernels(str(tmp_path / "run_kerple_log_1" / "checkpoints"), 32)["kernel"]
    np.testing.assert_allclose(kernel["kernel"], expected, rtol=1e-4, atol=1e-6)

    fake_eval(str(records / "alibi_tiny_7"), "alibi", 7)  # a run being recorded: no record.json yet
    report = tmp_path / "report"
    assert make_report.main(["--records", str(records), "--out", str(report)]) == 0
    table = (report / "table3.md").read_text()
    assert "| alibi | 4.16 | 4.32 |" in table  # seed 1 alone: the unfinished record of seed 7 (3.16) is left out
    assert "## tiny, train length 16" in table and "kerple_log (window 16)" in table and "rotary" in table
    for png in ("kernels_tiny_L16.png", "trajectories_tiny_L16.png", "ppl_vs_length_tiny_L16.png"):
        assert (report / png).read_bytes()[:4] == b"\x89PNG"
    drift = (report / "drift.md").read_text()
    assert "| tiny | 16 | kerple_log | bias_p |" in drift and "| 8 | " in drift  # 4 heads x 2 seeds
    assert "alibi" not in drift  # nothing learned per head
    assert "| tiny | 16 | kerple_log | 8 |" in (report / "flat_kernels.md").read_text()  # 4 heads x 2 seeds
    assert "too few runs for a correlation (fewer than 5): tiny 16 (4)" in (report / "train_test.md").read_text().lower()
    trend = (report / "trend.md").read_text()
    assert "two or more train lengths" in trend  # one train length: no trend yet
    assert "## Is the model as good at every train length?" in trend and "No scheme has full-attention runs" in trend
    assert "## Does the gap follow the train length or the model's quality?" in trend and "No corpus has" in trend
    assert "No group has two or more seeds" in (report / "growth.md").read_text()  # alibi and rotary: seed 1 only


def test_report_from_records_refuses_a_bad_directory(tmp_path):
    cmd = [sys.executable, os.path.join(ROOT, "tools", "make_report.py"), "--out", str(tmp_path / "o")]
    missing = subprocess.run(cmd + ["--records", str(tmp_path / "nope")], capture_output=True, text=True)
    assert missing.returncode == 2 and "is not a directory" in missing.stderr and "Traceback" not in missing.stderr
    (tmp_path / "empty").mkdir()
    fake_eval(str(tmp_path / "empty" / "x"), "alibi", 1)  # results but no record.json
    empty = subprocess.run(cmd + ["--records", str(tmp_path / "empty")], capture_output=True, text=True)
    assert empty.returncode == 2 and "no complete run record" in empty.stderr and "Traceback" not in empty.stderr
    neither = subprocess.run(cmd, capture_output=True, text=True)
    assert neither.returncode == 2 and "--records" in neither.stderr


def test_run_matrix_skips_a_run_whose_record_is_complete(tmp_path):
    from study.experiments import write_matrix

    runs = write_matrix(["kerple_log"], {"tiny": str(tmp_path / "no_such_data")}, [1], str(tmp_path / "exp"),
                        str(tmp_path / "runs"), [])
    rec = tmp_path / "records" / runs[0].name
    rec.mkdir(parents=True)
    (rec / "record.json").write_text("{}")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "run_matrix.py"), str(tmp_path / "exp" / "matrix.json"),
                          "--records", str(tmp_path / "records")], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and "skipped (record complete)" in out.stdout
    assert not os.path.exists(runs[0].run_dir)  # nothing was trained


def test_trajectory_needs_training_rows(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"iteration": 5, "kind": "validation", "lm_loss": 1.0}) + "\n")
    with pytest.raises(ValueError, match="no training rows"):
        trajectory_from_metrics(str(path))


def test_a_labelled_run_is_its_own_report_row_beside_the_unlabelled_one(tmp_path, token_dataset):
    """T5 with scaled buckets (a matrix label) and v2's T5 of the same seed and train length are two
    rows; the label is in record.json and both evaluation copies."""
    from dataclasses import replace

    from study.results import load_results

    run = train_run(tmp_path, token_dataset, "rpe", seed=1)
    full = fake_eval(os.path.join(run.run_dir, "eval"), "rpe", 1)
    window = fake_eval(os.path.join(run.run_dir, "eval_window"), "rpe", 1, window=16)
    records = tmp_path / "records"
    write_record(str(records / "rpe_tiny_1"), run, full, None, metrics_path(run.run_dir), 32, 1.0)
    write_record(str(records / "rpe_tiny_L16_1"), replace(run, label="rpe (max distance L)"), full, window,
                 metrics_path(run.run_dir), 32, 1.0)
    labelled = records / "rpe_tiny_L16_1"
    assert json.loads((labelled / "record.json").read_text())["label"] == "rpe (max distance L)"
    assert json.loads((labelled / "eval_window.json").read_text())["label"] == "rpe (max distance L)"
    runs = load_results([str(records / "*" / "eval*.json")])
    assert sorted(r.scheme for r in runs) == ["rpe", "rpe (max distance L)", "rpe (max distance L) (window 16)"]
    assert {r.train_length for r in runs} == {16}


def test_run_matrix_window_of_L_is_each_runs_train_length(tmp_path):
    from megatron.errors import UserError
    from study.run_matrix import window_size

    full = fake_eval(str(tmp_path / "eval"), "kerple_log", 1)  # train_length 16
    path = os.path.join(full, "eval.json")
    assert window_size("L", path) == 16 and window_size("64", path) == 64 and window_size(None, path) is None
    with pytest.raises(UserError, match="give a window size or L"):
        window_size("x", path)


def test_run_matrix_shards_split_the_matrix_without_overlap(tmp_path):
    """--shard K/N: N processes (one per core) take disjoint runs that together cover the matrix."""
    from study.experiments import write_matrix

    runs = write_matrix(["kerple_log", "alibi", "rotary"], {"tiny": str(tmp_path / "no_such_data")}, [1, 2],
                        str(tmp_path / "exp"), str(tmp_path / "runs"), [])
    for r in runs:  # every run already recorded: the shards only list what they would run
        (tmp_path / "records" / r.name).mkdir(parents=True)
        (tmp_path / "records" / r.name / "record.json").write_text("{}")
    cmd = [sys.executable, os.path.join(ROOT, "tools", "run_matrix.py"), str(tmp_path / "exp" / "matrix.json"),
           "--records", str(tmp_path / "records")]
    taken = []
    for k in (1, 2):
        out = subprocess.run(cmd + ["--shard", f"{k}/2"], capture_output=True, text=True, cwd=ROOT)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()  # whole lines that name their shard: two shards share one log
        assert all(line.startswith("[") and f", shard {k}/2] " in line and line.endswith("skipped (record complete)")
                   for line in lines), lines
        taken.append([line.split("] ")[1].split(":")[0] for line in lines])
    assert taken[0] == [r.name for r in runs[0::2]] and taken[1] == [r.name for r in runs[1::2]]
    for bad in ("3/2", "0/2", "1", "a/b"):
        out = subprocess.run(cmd + ["--shard", bad], capture_output=True, text=True, cwd=ROOT)
        assert out.returncode == 2 and "--shard" in out.stderr and "1/2 and 2/2" in out.stderr
        assert "Traceback" not in out.stderr


def test_a_record_names_each_device_its_run_trained_on(tmp_path):
    """A resume on the same device adds nothing; one on another thread count is named with its first step.
    The trainer's start rows survive the trim of a resumed run (they sit at the step it resumes from)."""
    from megatron.process.metrics_file import trim_metrics
    from study.run_record import training_devices

    rows = [{"iteration": 0, "kind": "start", "device": "cpu (1 threads)", "processes": 1, "torch": "2.13.0"},
            *({"iteration": i, "kind": "train", "lm_loss": 5.0} for i in range(1, 6)),
            {"iteration": 3, "kind": "start", "device": "cpu (1 threads)", "processes": 1, "torch": "2.13.0"},
            {"iteration": 4, "kind": "start", "device": "cpu (2 threads)", "processes": 1, "torch": "2.13.0"}]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert training_devices(str(path)) == [
        {"from_step": 0, "device": "cpu (1 threads)", "processes": 1, "torch": "2.13.0"},
        {"from_step": 4, "device": "cpu (2 threads)", "processes": 1, "torch": "2.13.0"}]
    trim_metrics(str(path), 4)  # resuming from step 4 drops step 5 only
    assert [r["iteration"] for r in read_metrics(str(path)) if r["kind"] == "start"] == [0, 3, 4]
    path.write_text(json.dumps({"iteration": 1, "kind": "train", "lm_loss": 5.0}) + "\n")
    assert training_devices(str(path)) == []  # trained before start rows were logged: no claim
