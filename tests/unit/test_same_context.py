"""study/same_context.py: the change from 1x to kx told apart into the text and the context, from the
position-wise losses; and the replicate and head counts that read configurations once."""
import math

import pytest

from megatron.evaluation.results import RunResult
from study.claims import Study, flat_once
from study.replicates import replicate_differences
from study.same_context import split_change, split_rows


def run(seed=1, first=(3.0,) * 8, rest=3.2, ppl_1x=30.0, bin_size=8, dataset="code"):
    """A run at L = 64 whose 2048-token curve has 8-token bins: `first` over positions 0..63, `rest` after."""
    losses = list(first) + [rest] * (256 - len(first))
    return RunResult("p", "kerple_log", dataset, seed, None, 64, {64: ppl_1x, 2048: math.exp(sum(losses) / len(losses))},
                     positionwise={2048: (bin_size, losses)})


def test_the_split_recovers_the_text_and_the_context_and_multiplies_back():
    r = run()
    s = split_change(r, 32)
    head = math.exp(3.0)
    assert s["head_ppl"] == pytest.approx(head)
    assert s["text"] == pytest.approx(100 * (head / 30.0 - 1))
    assert s["context"] == pytest.approx(100 * (r.ppl[2048] / head - 1))
    assert (1 + s["text"] / 100) * (1 + s["context"] / 100) == pytest.approx(1 + s["total"] / 100)


def test_a_run_that_cannot_be_split_is_left_out_not_guessed():
    coarse = RunResult("p", "kerple_log", "code", 1, None, 64, {64: 30.0, 2048: 28.0},
                       positionwise={2048: (128, [3.0] * 16)})  # positions 0..63 fall inside one 128-token bin
    no_curve = RunResult("p", "kerple_log", "code", 2, None, 64, {64: 30.0, 2048: 28.0})
    assert split_change(coarse, 32) is None and split_change(no_curve, 32) is None
    assert split_rows([coarse, no_curve, run(seed=3)]) == {("code", 64, "kerple_log"): {3: split_change(run(seed=3), 32)}}


def test_a_configuration_trained_twice_counts_its_heads_once():
    study = Study([], [])
    study.identity = {("a", 64, "kerple_log", 1): "same", ("b", 64, "kerple_log", 1): "same"}
    rows = [{"dataset": d, "train_length": 64, "scheme": "kerple_log", "seed": 1, "head": h, "f": {1: f}}
            for d, f in (("a", -0.5), ("b", -0.8)) for h in (0, 1)]
    rows.append({"dataset": "c", "train_length": 64, "scheme": "kerple_log", "seed": 1, "head": 0, "f": {1: -3.0}})
    assert flat_once(study, rows) == (2, 3)  # mean f(L) -0.65 >= -ln 2 on both shared heads; c's head not flat
    study.identity = {}
    assert flat_once(study, rows) == (2, 5)  # without identities every run is its own


def test_replicate_pairs_compare_only_the_lengths_scored_on_the_same_text():
    a = RunResult("a", "kerple_log", "x_16seq", 1, None, 64, {64: 30.0, 128: 29.0}, data_seed=1,
                  windows={64: 10, 128: 5})
    b = RunResult("b", "kerple_log", "x_warmup10", 1, None, 64, {64: 30.3, 128: 29.0}, data_seed=1,
                  windows={64: 10, 128: 6})  # 128 scored on other windows
    other = RunResult("c", "kerple_log", "x_warmup10", 2, None, 64, {64: 31.0}, data_seed=1, windows={64: 10})
    ident = {("x_16seq", 64, "kerple_log", 1): "s1", ("x_warmup10", 64, "kerple_log", 1): "s1",
             ("x_warmup10", 64, "kerple_log", 2): "s2"}
    pairs = replicate_differences([a, b, other], ident)
    assert len(pairs) == 1 and list(pairs[0]["diff"]) == [64]
    assert pairs[0]["diff"][64] == pytest.approx(100 * (30.0 / 30.3 - 1))
