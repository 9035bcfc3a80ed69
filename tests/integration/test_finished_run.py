"""A finished run started again (issue 34 item 7): it says so and exits 0 adding no row to
metrics.jsonl (it used to append another validation and test row each time); a run killed after
its last save but before its final evaluation still evaluates when started again."""
import os

from megatron.config import load_config
from megatron.training.metrics_file import metrics_path, read_metrics
from tests.conftest import train_config_dict, write_yaml


def _run(cfg_path, capsys=None):
    from megatron.training.trainer import Trainer

    return Trainer(load_config([cfg_path])).train()


def test_a_finished_run_started_again_does_nothing_and_says_so(tmp_path, token_dataset, capsys):
    ck, run = str(tmp_path / "ck"), str(tmp_path / "run")
    path = write_yaml(tmp_path / "a.yml", train_config_dict(tmp_path, token_dataset, train_iters=4, save=ck,
                                                            load=ck, save_interval=4, run_dir=run))
    first = _run(path)
    assert first["iteration"] == 4 and "test" in first
    rows = read_metrics(metrics_path(run))
    capsys.readouterr()
    again = _run(path)
    out = capsys.readouterr().out
    assert again["exit_code"] == 0 and again.get("already_finished")
    assert "this run already finished" in out and "Raise train-iters" in out
    assert read_metrics(metrics_path(run)) == rows  # not one row more


def test_a_run_killed_before_its_final_evaluation_evaluates_when_started_again(tmp_path, token_dataset):
    ck, run = str(tmp_path / "ck"), str(tmp_path / "run")
    path = write_yaml(tmp_path / "a.yml", train_config_dict(tmp_path, token_dataset, train_iters=4, save=ck,
                                                            load=ck, save_interval=4, run_dir=run))
    _run(path)
    mpath = metrics_path(run)
    kept = [line for line in open(mpath) if '"kind": "test"' not in line]  # as if it died before the test row
    with open(mpath, "w") as f:
        f.writelines(kept)
    again = _run(path)
    assert not again.get("already_finished") and "test" in again
    assert sum(r["kind"] == "test" for r in read_metrics(mpath)) == 1
    assert os.path.isfile(os.path.join(ck, "latest"))
