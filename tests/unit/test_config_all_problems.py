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
