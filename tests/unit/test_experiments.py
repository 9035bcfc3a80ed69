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


def test_per_dataset_tokenizers(tmp_path):
    """Domains with their own tokenizer: each run's YAML sets its dataset's vocab-file."""
    data = parse_data(["code=data/code/code_text_document", "web=data/web/web_text_document"])
    runs = write_matrix(["alibi"], data, [1], str(tmp_path / "exp"), "runs/m", PAPER,
                        vocab_files=parse_data(["code=data/code/tokenizer.json"], "NAME=TOKENIZER_FILE"))
    code, web = (json.loads(open(r.config).read()) for r in runs)
    assert code["vocab-file"] == "data/code/tokenizer.json" and "vocab-file" not in web
    with pytest.raises(ValueError, match="--vocab for datasets not in --data: latex"):
        write_matrix(["alibi"], data, [1], str(tmp_path / "exp2"), "runs/m", PAPER, vocab_files={"latex": "t.json"})
    with pytest.raises(ValueError, match="--vocab 'code' must look like NAME=TOKENIZER_FILE"):
        parse_data(["code"], "NAME=TOKENIZER_FILE")
