"""The gap at 1x and its growth to kx (study/growth.py)."""
import pytest

from megatron.evaluation.results import RunResult
from study.growth import growth_markdown, growth_rows


def run(scheme, seed, ppl, L=64, dataset="code", window=None):
    return RunResult(f"{scheme}_{seed}_{L}", scheme, dataset, seed, window, L, dict(ppl))


def curve(ppl_1x, growth_8x, growth_32x, L=64):
    return {L: ppl_1x, 8 * L: ppl_1x * growth_8x, 32 * L: ppl_1x * growth_32x}


def test_a_run_worse_everywhere_by_the_same_factor_has_no_growth_gap():
    """A: 10% worse at every length (a worse language model, the same extrapolation): growth gap 0.
    B: level at 1x, then ppl(32L)/ppl(L) 1.2 against the reference's 1.5: growth gap 100 (1.2/1.5 - 1) = -20."""
    runs = []
    for seed, jitter in ((1, 1.00), (2, 1.03), (3, 0.98)):
        ref = curve(50 * jitter, 1.3, 1.5)
        runs += [run("kerple_log", seed, ref),
                 run("a_worse", seed, {k: 1.1 * v for k, v in ref.items()}),
                 run("b_extrapolates", seed, curve(50 * jitter, 1.1 + 0.01 * seed, 1.2 + 0.01 * seed))]
    rows = {r["scheme"]: r for r in growth_rows(runs)[("code", 64)]}
    assert list(rows) == ["a_worse", "b_extrapolates"]  # the reference has no row of its own
    a, b = rows["a_worse"], rows["b_extrapolates"]
    assert a["gap_1x"] == pytest.approx({1: 10.0, 2: 10.0, 3: 10.0}) and a["gap"][32][2] == pytest.approx(10.0)
    assert a["growth"][32] == pytest.approx({1: 0.0, 2: 0.0, 3: 0.0}, abs=1e-9)
    assert b["gap_1x"] == pytest.approx({1: 0.0, 2: 0.0, 3: 0.0}, abs=1e-9)
    assert b["growth"][32][1] == pytest.approx(100 * (1.21 / 1.5 - 1))
    assert b["test"][32].other_better and not b["test"][32].reference_better and b["test"][32].n == 3
    md = growth_markdown(growth_rows(runs))
    assert "## code, train length 64" in md
    assert "| b_extrapolates | 3 | +0.0 ± 0.0 | " in md and "| 3/3 | " in md and "‡" in md
    assert "| p | Holm | exact |" in md and "| 0.25 |" in md  # the exact test's floor with 3 pairs
    assert "| a_worse | 3 | +10.0 ± 0.0 | +10.0 ± 0.0 | " in md


def test_windowed_runs_unpaired_seeds_and_missing_lengths_give_no_row():
    runs = [run("kerple_log", s, curve(50 + s, 1.3, 1.5)) for s in (1, 2)]
    runs += [run("kerple_log (window 64)", s, curve(50 + s, 1.2, 1.3), window=64) for s in (1, 2)]
    runs += [run("alibi", 1, curve(55, 1.3, 1.5)), run("alibi", 3, curve(55, 1.3, 1.5))]  # one seed paired
    short = {64: 52.0, 512: 60.0}  # evaluated to 8x only: a row at 8x, dashes at 32x
    runs += [run("rotary", s, {k: v + s for k, v in short.items()}) for s in (1, 2)]
    rows = growth_rows(runs)[("code", 64)]
    assert [r["scheme"] for r in rows] == ["rotary"] and list(rows[0]["growth"]) == [8]
    assert "| rotary | 2 | " in growth_markdown({("code", 64): rows}) and "| – | – | – | – |" in growth_markdown(
        {("code", 64): rows})
    assert growth_rows([run("alibi", s, curve(50, 1, 1)) for s in (1, 2)]) == {}  # no reference in the group
    assert "No group has" in growth_markdown({})
