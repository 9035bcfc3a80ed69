"""The table against the paper's own claims (study/paper_claims.py) and the report's other worded verdicts:
no verdict may read stronger than its test. Each rule is checked on cases whose answer is known, and the
committed report is read back for a cell that says more than the p beside it."""
import math
import os
import re

import numpy as np
import pytest

from megatron.evaluation.results import RunResult
from study.claims import narrowing_wording
from study.paper_claims import AGREE, DISAGREE, NOT_RUN, NOT_SHOWN, Comparison, Evidence, cell_text, decide, verdicts
from tests.conftest import ROOT

LENGTHS = (64, 128, 256, 512, 1024, 2048)


def comparison(*evidence, name="vs ALiBi"):
    return Comparison(name, tuple(Evidence(at, claimed, p) for at, claimed, p in evidence))


@pytest.mark.parametrize("evidence, word", [
    ([("8x", True, 0.049)], AGREE),
    ([("8x", True, 0.051)], NOT_SHOWN),  # just past the threshold: never "agree"
    ([("8x", True, math.nan)], NOT_SHOWN),  # no test (one seed)
    ([("8x", False, 0.04)], DISAGREE),
    ([("8x", False, 0.06)], NOT_SHOWN),  # the means go against it, but not significantly
    ([("2x", True, 0.01), ("32x", False, 0.03)], DISAGREE),  # against at one length outweighs support at another
])
def test_one_comparison_is_decided_by_its_adjusted_p_alone(evidence, word):
    assert decide([comparison(*evidence)]).word == word


def test_a_claim_of_several_comparisons_agrees_only_when_every_one_is_shown():
    shown, open_ = comparison(("32x", True, 0.01), name="vs ALiBi"), comparison(("32x", True, 0.2), name="vs T5")
    v = decide([shown, open_])
    assert v.word == NOT_SHOWN and "open: vs T5, smallest p_holm 0.2" in v.detail
    assert decide([shown, comparison(("32x", True, 0.03), name="vs T5")]).word == AGREE
    assert decide([shown, comparison(("32x", False, 0.03), name="vs T5")]).word == DISAGREE
    assert decide([]).word == NOT_RUN


def test_random_evidence_never_gives_a_verdict_its_p_values_do_not_carry():
    rng = np.random.default_rng(55)
    for _ in range(500):
        comps = [comparison(*[(f"{k}x", bool(rng.integers(2)), float(rng.uniform(0, 0.2)))
                              for k in range(rng.integers(1, 4))], name=f"c{i}") for i in range(rng.integers(1, 4))]
        v = decide(comps)
        against = any(e.p_holm < 0.05 and not e.claimed for c in comps for e in c.evidence)
        every = all(any(e.p_holm < 0.05 and e.claimed for e in c.evidence) for c in comps)
        assert v.word == (DISAGREE if against else AGREE if every else NOT_SHOWN)


def run(scheme, dataset, seed, ppl, L=64):
    return RunResult(f"{dataset}/{scheme}/{seed}", scheme, dataset, seed, None, L, dict(ppl))


def test_alibi_clearly_better_is_a_disagreement_and_a_missing_scheme_is_not_run():
    """Five seeds with ALiBi 10% below kerple_log at every length (a little noise): Table 3's row is Holm-significant
    against the claim "log < ALiBi", so code disagrees; a near-tie with noise is not shown; web has no runs."""
    runs = []
    for seed, jitter in enumerate((1.0, 1.01, 0.99, 1.02, 0.98)):
        base = {L: 40.0 * jitter + L / 1000 for L in LENGTHS}
        runs.append(run("kerple_log", "code", seed, base))
        runs.append(run("alibi", "code", seed, {L: v * (0.9 + 0.002 * seed) for L, v in base.items()}))
        runs.append(run("kerple_log", "latex", seed, base))
        runs.append(run("alibi", "latex", seed, {L: v * (1 + 0.01 * (-1) ** seed) for L, v in base.items()}))
    found = verdicts(runs)
    assert found[("log_below_alibi", "code")]["v2"].word == DISAGREE
    assert found[("log_below_alibi", "latex")]["v2"].word == NOT_SHOWN
    assert found[("log_below_alibi", "web")]["v2"].word == NOT_RUN
    assert cell_text(found[("log_below_alibi", "web")]) == "v2: **not run**; v3: not run"
    assert found[("log_beats_rotary", "code")]["v2"].word == NOT_RUN  # no rotary run: not guessed at


VERDICT = re.compile(r"\*\*(agree|disagree|not shown|not run)\*\*|(not shown) in ")


def paper_table_cells(text: str) -> list[str]:
    start = text.index("## The paper's own claims against these records")
    rows = [line for line in text[start:].split("\n\n", 3)[2].splitlines() if line.startswith("| ")][1:]
    return [cell for row in rows for cell in row.split(" | ")[2:]]


def test_no_cell_of_the_committed_table_reads_stronger_than_the_p_beside_it():
    """agree / disagree only with every p_holm quoted for it below 0.05; not shown only with its smallest p_holm
    at 0.05 or above (a comparison below 0.05 would have decided it)."""
    with open(os.path.join(ROOT, "docs", "results", "README.md")) as f:
        cells = paper_table_cells(f.read())
    assert len(cells) == 27  # 9 claims x 3 domains
    for cell in cells:
        marks = list(VERDICT.finditer(cell))
        assert marks and marks[0].start() <= len("v2: "), cell
        for m, nxt in zip(marks, marks[1:] + [None]):
            word = m.group(1) or m.group(2)
            segment = cell[m.end():nxt.start() if nxt else len(cell)]
            if word in (AGREE, DISAGREE):
                ps = [float(x) for x in re.findall(r"p_holm (?:<= )?([0-9.e+-]+)", segment)]
                assert ps and all(p < 0.05 for p in ps), (word, segment)
            for x in re.findall(r"smallest p_holm ([0-9.e+-]+)", segment):
                assert word == NOT_SHOWN and float(x) >= 0.05, (word, segment)


@pytest.mark.parametrize("slope, first, p_all, start", [
    (0.5, -2.0, 0.22, "not shown after correcting for 25 slopes"),  # significant only within its own table
    (0.5, -2.0, 0.01, "shown after correcting for 25 slopes"),
    (-0.5, -2.0, 0.01, "contradicted after correcting for 25 slopes: the gap widens"),
    (-0.5, -2.0, 0.5, "not shown after correcting for 25 slopes"),
])
def test_a_narrowing_is_asserted_only_when_it_survives_the_correction_over_every_slope(slope, first, p_all, start):
    text = narrowing_wording(slope, first, p_all, 25, 0.043, 5)
    assert text.startswith(start)
    assert text.endswith(f"(Holm p {p_all:.2g} over all 25; 0.043 within its own table of 5)")


def test_the_report_states_the_latex_narrowing_through_its_wording_only():
    """The equal-sequence heading and both summaries take the verdict from the claim, not from typed words."""
    for path in ("README.template.md", "summary.template.md"):
        with open(os.path.join(ROOT, "docs", "results", path)) as f:
            text = f.read()
        assert "{{latex_16seq_window_32x_narrowing}}" in text
        assert "gap narrows" not in text and "narrowing gap on LaTeX" not in text
