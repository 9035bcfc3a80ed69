"""Every input a training run reads is checked at start, all problems at once (megatron/config/inputs.py)."""
from __future__ import annotations

import os

import pytest

from megatron.config import ConfigError, load_config
from megatron.config.inputs import check_inputs, input_problems
from tests.conftest import TINY_MODEL, write_token_dataset, write_yaml


def cfg_with(tmp_path, **over):
    data = {**TINY_MODEL, "train-iters": 2}
    data.update({k.replace("_", "-"): v for k, v in over.items()})
    return load_config([write_yaml(tmp_path / "run.yml", data)])


def messages(cfg) -> str:
    return "\n".join(str(p) for p in input_problems(cfg))


def test_a_complete_run_has_no_problems(tmp_path):
    prefix = write_token_dataset(str(tmp_path / "d"), num_docs=5)
    ck = tmp_path / "ck"
    assert input_problems(cfg_with(tmp_path, data_path=prefix, save=str(ck), load=str(ck), save_interval=5)) == []


def test_all_missing_inputs_reported_at_once_with_key_and_file(tmp_path):
    half = write_token_dataset(str(tmp_path / "half"), num_docs=5)
    os.remove(half + ".idx")
    cfg = cfg_with(tmp_path, train_data_paths=[str(tmp_path / "nope")], valid_data_paths=[half],
                   padded_vocab_size=None, tokenizer_type="GPT2BPETokenizer",
                   vocab_file=str(tmp_path / "vocab.json"), load=str(tmp_path / "elsewhere"))
    with pytest.raises(ConfigError) as e:
        check_inputs(cfg)
    err = str(e.value)
    assert "(5 problems)" in err and "run.yml" in err
    assert "train-data-paths" in err and "nope.bin and " in err and "nope.idx are missing" in err
    assert "valid-data-paths" in err and "half.idx is missing" in err and "half.bin" not in err
    assert "vocab-file" in err and "merge-file" in err and "it is not set" in err
    assert "load" in err and "no such directory" in err


def test_training_without_data_and_prefix_with_suffix(tmp_path):
    assert "training needs data" in messages(cfg_with(tmp_path))
    prefix = write_token_dataset(str(tmp_path / "d"), num_docs=5)
    assert "without the suffix" in messages(cfg_with(tmp_path, data_path=prefix + ".bin"))


def test_tokenizer_files_checked_only_when_read(tmp_path):
    prefix = write_token_dataset(str(tmp_path / "d"), num_docs=5)
    # padded-vocab-size given: training never opens the tokenizer files
    assert messages(cfg_with(tmp_path, data_path=prefix, tokenizer_type="HFTokenizer")) == ""
    err = messages(cfg_with(tmp_path, data_path=prefix, tokenizer_type="HFTokenizer", eod_mask_loss=True))
    assert "vocab-file" in err and "HFTokenizer needs vocab-file" in err
    tiktoken = tmp_path / "gpt2.tiktoken"
    tiktoken.write_text("")
    assert messages(cfg_with(tmp_path, data_path=prefix, padded_vocab_size=None, vocab_file=str(tiktoken))) == ""


def test_load_rules(tmp_path):
    """load == save with nothing saved yet is a fresh start (the quickstart re-run idiom); any other
    load must hold a checkpoint, or training would silently start from scratch."""
    prefix = write_token_dataset(str(tmp_path / "d"), num_docs=5)
    ck = str(tmp_path / "ck")
    assert messages(cfg_with(tmp_path, data_path=prefix, save=ck, load=ck, save_interval=1)) == ""
    os.makedirs(ck)
    assert messages(cfg_with(tmp_path, data_path=prefix, save=ck, load=ck, save_interval=1)) == ""
    other = str(tmp_path / "other")
    os.makedirs(other)
    assert "no `latest`" in messages(cfg_with(tmp_path, data_path=prefix, load=other))
    assert "global_step7 does not exist" in messages(cfg_with(tmp_path, data_path=prefix, load=ck, iteration=7))
    (tmp_path / "other" / "latest").write_text("global_step1")
    assert messages(cfg_with(tmp_path, data_path=prefix, load=other)) == ""


def test_loading_a_config_never_checks_paths(tmp_path):
    """evaluate.py/generate.py load a checkpoint's resolved config from another machine."""
    cfg = cfg_with(tmp_path, data_path="/nonexistent/prefix", load="/nonexistent/ck")
    assert cfg.data.data_path == "/nonexistent/prefix"
