"""The nested sections are checked like flat keys (issue 34 items 4-5): unknown keys inside
optimizer / zero_optimization named at once with a close match and the file, all problems in one
message; `-o` takes dotted paths into a section (the rest keeps its values) and NeoX's flat `lr`,
and names `-o` as the source."""
import pytest

from megatron.config import ConfigError, load_config
from megatron.config.nested import ZERO_KEYS
from tests.conftest import TINY_MODEL, write_yaml


def _error(tmp_path, data, overrides=None) -> str:
    with pytest.raises(ConfigError) as e:
        load_config([write_yaml(tmp_path / "c.yml", {**TINY_MODEL, **data})], overrides)
    return str(e.value)


def test_unknown_nested_keys_are_named_at_once_with_file_and_suggestion(tmp_path):
    msg = _error(tmp_path, {"zero_optimization": {"stag": 1},
                            "optimizer": {"type": "Adam", "params": {"lrr": 1e-3, "betas": [0.9, 0.99]}}})
    assert "unknown key zero_optimization.stag; did you mean zero_optimization.stage?" in msg
    assert "unknown key optimizer.params.lrr; did you mean optimizer.params.lr?" in msg
    assert "c.yml" in msg and "must be a number > 0, got None" not in msg  # the cause, not its symptom


def test_dotted_overrides_change_one_value_and_keep_the_rest(tmp_path):
    base = {"optimizer": {"type": "Adam", "params": {"lr": 1e-3, "betas": [0.9, 0.99], "eps": 1e-8}}}
    cfg = load_config([write_yaml(tmp_path / "c.yml", {**TINY_MODEL, **base})],
                      {"optimizer.params.lr": 3e-4, "zero_optimization.stage": 1})
    assert cfg.optimizer.lr == 3e-4 and cfg.optimizer.betas == (0.9, 0.99)
    assert cfg.optimizer.zero_optimization["stage"] == 1
    assert load_config([write_yaml(tmp_path / "c.yml", {**TINY_MODEL, **base})], {"lr": 5e-4}).optimizer.lr == 5e-4


def test_a_later_whole_section_still_wins_over_an_earlier_dotted_value(tmp_path):
    a = write_yaml(tmp_path / "a.yml", {**TINY_MODEL, "lr": 1e-2})
    b = write_yaml(tmp_path / "b.yml", {"optimizer": {"type": "Adam", "params": {"lr": 2e-4}}})
    assert load_config([a, b]).optimizer.lr == 2e-4


def test_an_override_s_problem_names_the_command_line(tmp_path):
    msg = _error(tmp_path, {}, {"optimizer.params.lrr": 1.0, "num-layerz": 3})
    assert "optimizer.params.lrr" in msg and "-o on the command line" in msg
    assert "unknown key 'num-layerz' (in -o on the command line)" in msg
    assert "is not a section that takes a dotted path" in _error(tmp_path, {}, {"num-layers.x": 1})


def test_zero_keys_are_the_installed_deepspeed_s():
    zero = pytest.importorskip("deepspeed.runtime.zero.config")
    fields = set()
    for name, f in zero.DeepSpeedZeroConfig.model_fields.items():
        fields |= {name} | ({f.alias} if f.alias else set())
    assert set(ZERO_KEYS) == fields
