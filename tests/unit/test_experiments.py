"""The experiment-matrix generator: one loadable YAML per (scheme, dataset, seed)."""
import json
import os

import pytest

from megatron.config import load_config
from megatron.experiments import parse_data, read_matrix, write_matrix
from tests.conftest import ROOT

PAPER = [os.path.join(ROOT, "configs", "paper", f) for f in ("local_setup.yml", "train.yml")]


def test_matrix_files_load_on_top_of_the_paper_configs(tmp_path):
    runs = write_matrix(["kerple_log", "alibi"], parse_data(["github=data/github/github_text_document"]),
                        [1235, 1236], str(tmp_path / "exp"), "runs/m", PAPER)
    assert [r.name for r in runs] == ["kerple_log_github_1235", "alibi_github_1235",
                                      "kerple_log_github_1236", "alibi_github_1236"]
    cfg = load_config(PAPER + [runs[1].config])
    assert cfg.model.pos_emb == "alibi" and cfg.training.seed == 1235
    assert cfg.checkpoint.save == cfg.checkpoint.load == "runs/m/alibi_github_1235/checkpoints"
    assert cfg.data.data_path == "data/github/github_text_document"
    base, again = read_matrix(str(tmp_path / "exp" / "matrix.json"))
    assert base == PAPER and again == runs
    assert json.loads(open(runs[0].config).read())["pos-emb"] == "kerple_log"


def test_bad_inputs():
    with pytest.raises(ValueError, match="NAME=DATA_PREFIX"):
        parse_data(["github"])
    with pytest.raises(ValueError, match="unknown schemes"):
        write_matrix(["kerple_logg"], {"x": "p"}, [1], "/tmp/unused-matrix", "runs", [])
    with pytest.raises(ValueError, match="does not exist"):
        read_matrix("/nonexistent/matrix.json")
