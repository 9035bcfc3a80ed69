"""GPT-NeoX's own config files (tests/fixtures/neox_configs, verbatim) load as `deepy.py --dry-run`
reads them: every model shape with NeoX's local_setup.yml and a small training section has no
config problem (only its data and tokenizer files are missing here), and each file of a feature
this stack lacks is refused with one line naming that feature."""
from __future__ import annotations

import os

import pytest
import yaml

from megatron.config import ConfigError, load_config
from megatron.config.errors import INPUT
from megatron.config.inputs import input_problems
from tests.conftest import ROOT

NEOX = os.path.join(ROOT, "tests", "fixtures", "neox_configs")
SHAPES = ["20B.yml", *(f"pythia/{s}.yml" for s in ("14M", "70M", "160M", "410M", "1B", "1-4B", "2-8B", "6-9B", "12B")),
          *(f"llama/{s}.yml" for s in ("7B", "13B", "30B", "65B")),
          *(f"llama2/{s}.yml" for s in ("7B", "13B", "70B", "codellama_7B", "codellama_34B")), "mistral/7B.yml"]
# NeoX's mistral/7B.yml gives Hugging Face's per-half MLP width; NeoX's rule needs 3x (see the README there)
FIXES = {"mistral/7B.yml": {"intermediate-size": 3 * 14336}}
REFUSED = {"mamba/mamba-130M.yml": "Mamba blocks", "rwkv/170M.yml": "RWKV blocks", "gmlp_small.yml": "gMLP",
           "1-3B-transformer-engine.yml": "Transformer Engine", "125M-dmoe.yml": "mixture-of-experts",
           "bnb_125M.yml": "bitsandbytes", "sparse.yml": "block-sparse"}


def training_section(tmp_path, **extra) -> str:
    """What a user adds to a model file: batch size, length of the run, how often to save
    (local_setup.yml sets `save`), and the vocabulary size in place of the tokenizer file (not in
    this repository)."""
    path = tmp_path / "training.yml"
    path.write_text(yaml.safe_dump({"train-iters": 10, "train-micro-batch-size-per-gpu": 1, "checkpoint-factor": 5,
                                    "padded-vocab-size": 50304, **extra}))
    return str(path)


@pytest.mark.parametrize("name", SHAPES)
def test_neox_model_file_dry_runs_with_only_files_missing(name, tmp_path):
    # with local_setup.yml as NeoX users run them: pythia/14M.yml's own train/valid/test-data-paths take
    # precedence over its data-path, as in NeoX
    cfg = load_config([os.path.join(NEOX, name), os.path.join(NEOX, "local_setup.yml"),
                       training_section(tmp_path, **FIXES.get(name, {}))])
    problems = input_problems(cfg)
    assert problems and all(p.kind == INPUT for p in problems), [str(p) for p in problems]  # data files only


def test_neox_mistral_file_as_it_is_is_refused_naming_the_mlp_width(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config([os.path.join(NEOX, "mistral/7B.yml"), training_section(tmp_path)])
    [problem] = e.value.problems
    assert "intermediate-size = 14336" in str(problem) and "mismatched layers" in str(problem)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_neox_file_of_a_missing_feature_is_refused_in_one_line_naming_it(name, tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config([os.path.join(NEOX, name), training_section(tmp_path)])
    lines = [str(p) for p in e.value.problems]
    naming = [line for line in lines if REFUSED[name] in line]
    assert len(naming) == 1 and "not supported by this stack" in naming[0], lines
    assert not any("unknown key '" in line for line in lines), lines  # its keys are the feature's, not typos
