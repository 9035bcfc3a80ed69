"""One load reports every problem it can: a typo'd value in one section no longer hides a
cross-field problem in another (the section rules and the rules across sections run for every
section that typed cleanly), and a partially built config never crashes a rule."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from megatron.config import ConfigError, load_config
from megatron.config.cross import RULES
from megatron.config.schema import SECTIONS

TINY = {"num-layers": 2, "hidden-size": 32, "num-attention-heads": 4, "seq-length": 64,
        "train-iters": 3, "train_micro_batch_size_per_gpu": 2}


def problems(**overrides) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load_config([], overrides={**TINY, **overrides})
    return [str(p) for p in e.value.problems]


def test_a_typo_and_cross_field_problems_elsewhere_in_one_error():
    found = problems(**{"lr-decay-style": "cosin",  # optimizer: a typo'd value
                        "hidden-size": 48, "num-attention-heads": 6, "model-parallel-size": 4,  # model x parallel
                        "train-batch-size": 7, "gradient-accumulation-steps": 1})  # training's own rule
    assert len(found) == 3, found
    assert any("lr-decay-style = 'cosin'" in p and "did you mean 'cosine'" in p for p in found)
    assert any("num-attention-heads = 6" in p and "divisible by model-parallel-size (4)" in p for p in found)
    assert any("train-batch-size = 7" in p and "multiple of micro-batch" in p for p in found)


def test_a_rule_across_three_sections_runs_beside_a_typo_in_a_fourth():
    found = problems(**{"pos-clamp": "projected", "precision": "fp16", "log-interval": "often"})
    assert any("pos-clamp = 'projected'" in p and "ZeRO" in p for p in found)
    assert any("log-interval = 'often'" in p for p in found)


def test_rules_needing_a_broken_section_are_skipped_not_crashed():
    # parallel does not type: the heads rule (model x parallel) would judge a guessed size
    found = problems(**{"hidden-size": 48, "num-attention-heads": 6, "model-parallel-size": "four"})
    assert len(found) == 1 and "model-parallel-size = 'four'" in found[0]
    # a required model key missing: no model section, nothing that reads it runs
    found = problems(**{"num-layers": None, "model-parallel-size": 3, "pos-clamp": "projected"})
    assert len(found) == 1 and "num-layers" in found[0]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.check.__name__)
def test_each_rule_reads_only_the_sections_it_declares(rule):
    """A rule that read an undeclared section would crash on a config where that section did not
    build: each is run with only its declared sections present."""
    assert set(rule.sections) <= set(SECTIONS)
    cfg = load_config([], overrides=TINY)
    rule.check(SimpleNamespace(**{s: getattr(cfg, s) for s in rule.sections}))


NEOX = "tests/fixtures/neox_configs"


def _problems_of(paths, **overrides) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load_config(paths, overrides=overrides)
    return [str(p) for p in e.value.problems]


def test_missing_required_keys_and_the_sections_own_rules_in_one_error():
    """Issue 45: NeoX's llama/7B.yml with local_setup.yml reported train-iters and save, and only the
    next run the missing micro-batch: a section missing a required key skipped its own rules."""
    found = _problems_of([f"{NEOX}/llama/7B.yml", f"{NEOX}/local_setup.yml"])
    assert len(found) == 3, found
    assert any("train-iters is required" in p for p in found)
    assert any("set train-micro-batch-size-per-gpu or train-batch-size" in p for p in found)
    assert any("checkpoint-factor (or save-interval) is required" in p for p in found)


def test_a_mamba_file_gets_the_feature_line_only():
    """Issue 45: Mamba's refusal carried an unrelated output-layer-init-method line: NeoX's
    `single_residual_scaled_normal` is a NeoX init (sigma / sqrt(L)), accepted like its others."""
    found = _problems_of([f"{NEOX}/mamba/mamba-130M.yml", f"{NEOX}/local_setup.yml"],
                         **{"train-iters": 1, "checkpoint-factor": 1, "train-micro-batch-size-per-gpu": 1})
    assert len(found) == 1 and found[0].startswith("Mamba blocks"), found


def test_a_mistyped_section_in_a_dotted_override_gets_a_suggestion():
    found = _problems_of(["configs/quickstart.yml"], **{"optimzer.params.lr": 1e-3})
    assert len(found) == 1 and "did you mean 'optimizer'?" in found[0], found
    cfg = load_config(["configs/quickstart.yml"], overrides={"fp16.enabled": False})  # a section off by default
    assert cfg.precision.fp16["enabled"] is False


def test_a_gated_mlp_width_that_does_not_fit_names_the_values_that_do():
    """Issue 45: the Mistral message said 'drop it for the default' where the README (now docs/launching.md) says 43008."""
    found = _problems_of([f"{NEOX}/mistral/7B.yml", f"{NEOX}/local_setup.yml"],
                         **{"train-iters": 1, "checkpoint-factor": 1, "train-micro-batch-size-per-gpu": 1})
    assert len(found) == 1 and "intermediate-size to 43008 for halves of 14336" in found[0], found
    assert "14335, 14337" in found[0] and "default" not in found[0]
    cfg = load_config([f"{NEOX}/mistral/7B.yml", f"{NEOX}/local_setup.yml"],
                      overrides={"train-iters": 1, "checkpoint-factor": 1, "train-micro-batch-size-per-gpu": 1,
                                 "intermediate-size": 43008})
    assert cfg.model.mlp_widths == (28672, 14336)


def test_a_config_error_ends_without_the_traceback_hint(tmp_path, monkeypatch, capsys):
    """Issue 45: a config's list of problems (and 'config OK; missing files only') ended with '(run
    with --debug ... for the full traceback)', though the traceback shows only the loader."""
    from tests.conftest import deepy_exit, write_yaml

    code, err = deepy_exit(monkeypatch, capsys, write_yaml(tmp_path / "c.yml", {**TINY, "pos-emb": "kerple-lg"}))
    assert code != 0 and "pos-emb" in err and "full traceback" not in err, err
