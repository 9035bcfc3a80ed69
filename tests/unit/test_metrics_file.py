"""metrics.jsonl: one tolerant reader for every tool; a killed writer's half row is skipped, not a crash."""
import json
import types

import pytest

from megatron.errors import DataError
from megatron.process.logging import MetricsLogger
from megatron.process.metrics_file import read_metrics, trim_metrics

ROWS = [{"kind": "train", "iteration": i, "lm_loss": 5.0 - i, "elapsed_time_per_iteration_ms": 100.0 * i}
        for i in range(1, 5)]


def write(path, rows, tail=""):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)
    return path


def test_partial_last_line_is_skipped_everywhere(tmp_path):
    path = write(tmp_path / "metrics.jsonl", ROWS, tail='{"kind": "train", "iterat')  # writer killed mid-row
    assert read_metrics(path) == ROWS
    with open(path) as f:
        assert read_metrics(f) == ROWS
    from megatron.evaluation import sweep as evaluate  # its train_speed read rows with json.loads and crashed on the half row

    cfg = types.SimpleNamespace(logging=types.SimpleNamespace(run_dir=str(tmp_path)))
    assert evaluate.train_speed(cfg) == {"sec_per_step": 0.3, "steps": 4}


def test_corrupt_middle_line_names_file_and_line(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + '{"kind": "tr\n' + json.dumps(ROWS[1]) + "\n")
    with pytest.raises(DataError, match=r"metrics\.jsonl:2: not a JSON row .*delete that line"):
        read_metrics(path)
    path.write_text(json.dumps(ROWS[0]) + "\n[1, 2]\n")
    with pytest.raises(DataError, match=r"metrics\.jsonl:2: a JSON list, not a metrics row"):
        read_metrics(path)
    from megatron.evaluation import (
        sweep as evaluate,  # the evaluation is not lost over it: train_speed is left out, with a warning
    )

    assert evaluate.train_speed(types.SimpleNamespace(logging=types.SimpleNamespace(run_dir=str(tmp_path)))) is None
    assert "warning: no train_speed: " in capsys.readouterr().err


@pytest.mark.parametrize("row, key", [
    ({"kind": "train", "iteration": "abc", "lm_loss": 1.0}, "iteration"),
    ({"kind": "train", "iteration": -3, "lm_loss": 1.0}, "iteration"),
    ({"kind": "train", "iteration": True, "lm_loss": 1.0}, "iteration"),
    ({"kind": "train", "lm_loss": 1.0}, "iteration"),
    ({"kind": 7, "iteration": 2}, "kind"),
    ({"kind": "train", "iteration": 2, "lm_loss": "1.5"}, "lm_loss"),
    ({"kind": "train", "iteration": 2, "elapsed_time_per_iteration_ms": [100.0]}, "elapsed_time_per_iteration_ms"),
    ({"kind": "start", "iteration": 0, "device": 3}, "device"),
])
def test_a_row_of_the_wrong_shape_names_the_file_line_and_key(tmp_path, row, key):
    """A row read back is checked key by key (the tools did `r["iteration"] % every` and sorted the
    step times: a string there was a traceback far from the file)."""
    path = write(tmp_path / "metrics.jsonl", [ROWS[0], row, ROWS[1]])
    with pytest.raises(DataError, match=rf"metrics\.jsonl:2: `{key}` .*delete that line"):
        read_metrics(path)


def test_every_row_the_trainer_writes_passes_the_check(tmp_path):
    rows = [{"kind": "start", "iteration": 0, "device": "cpu (2 threads)", "processes": 1, "torch": "2.13.0"},
            *ROWS, {"kind": "validation", "iteration": 4, "lm_loss": 1.0, "lm_loss_ppl": 2.7, "grad_norm": None}]
    assert read_metrics(write(tmp_path / "metrics.jsonl", rows)) == rows


def test_resumed_writer_cuts_the_half_row_first(tiny_config, tmp_path):
    """Appending after a half row would glue the next row onto it: a corrupt line in the middle."""
    path = write(tmp_path / "metrics.jsonl", ROWS[:2], tail='{"kind": "train", "it')
    log = MetricsLogger(tiny_config(progress_bar=False), str(tmp_path), enabled=True)
    log.log_step(3, {"lm_loss": 2.0})
    log.close()
    rows = read_metrics(path)
    assert [r["iteration"] for r in rows] == [1, 2, 3]
    before = path.read_bytes()
    trim_metrics(str(path), None)
    trim_metrics(str(tmp_path / "absent"), None)
    assert path.read_bytes() == before and not (tmp_path / "absent").exists()
    (tmp_path / "one").write_bytes(b'{"half')  # a file with only a half row becomes empty
    trim_metrics(str(tmp_path / "one"), None)
    assert (tmp_path / "one").read_bytes() == b""
