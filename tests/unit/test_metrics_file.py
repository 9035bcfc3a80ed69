"""metrics.jsonl: one tolerant reader for every tool; a killed writer's half row is skipped, not a crash."""
import json
import types

import pytest

from megatron.errors import DataError
from megatron.training.logging import MetricsLogger
from megatron.training.metrics_file import read_metrics, trim_metrics

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
    import evaluate  # its train_speed read rows with json.loads and crashed on the half row

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
    import evaluate  # the evaluation is not lost over it: train_speed is left out, with a warning

    assert evaluate.train_speed(types.SimpleNamespace(logging=types.SimpleNamespace(run_dir=str(tmp_path)))) is None
    assert "warning: no train_speed: " in capsys.readouterr().err


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
