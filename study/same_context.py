"""Perplexity at k x L against 1x, with the text and the context told apart (issue 55).

evaluate.py scores each length on its own sample of windows, so ppl(kL) / ppl(L) compares other
text as well as longer context: a corpus's long windows can simply be easier (or harder) than its
short ones. The paper's Table 3 drew its windows per length the same way (320 per length,
configs/paper/ex_eval.yml), so it shares this confound. `evaluate.py --equal-text` removes it by
re-scoring a checkpoint; the study's checkpoints are not in its records, so this reads the control
that the records do hold: the position-wise losses. Positions 0..L-1 of a kL window are read with
the same 0..L-1 tokens of context as the L positions of a 1x window, so

    text change     = 100 (ppl over positions 0..L-1 of the kL windows / ppl(L) - 1)
                      (the same context, other text: how much easier the kL windows are)
    context change  = 100 (ppl(kL) / ppl over positions 0..L-1 of the kL windows - 1)
                      (the same windows, the context grown from < L to < kL tokens)

and (1 + text / 100) (1 + context / 100) = ppl(kL) / ppl(L) exactly. The context change is the
within-window control for "perplexity does not rise with length"; its positions differ (0..kL-1
against 0..L-1 of the same windows), but not its sample of text.
"""
from __future__ import annotations

import math
from collections import defaultdict


def split_change(run, factor: int) -> dict | None:
    """{"total", "text", "context"} in % for one run at factor x its train length, or None when the run
    lacks the perplexities or the position-wise curve to split it (no train length, no kL result, or
    positions 0..L-1 falling inside one bin of the kL curve)."""
    L = run.train_length
    if not L or L not in run.ppl or factor * L not in run.ppl:
        return None
    first = run.loss_over(factor * L, 0, L)
    if first is None:
        return None
    head = math.exp(first)  # perplexity over positions 0..L-1 of the kL windows
    return {"total": 100.0 * (run.ppl[factor * L] / run.ppl[L] - 1.0),
            "text": 100.0 * (head / run.ppl[L] - 1.0),
            "context": 100.0 * (run.ppl[factor * L] / head - 1.0),
            "head_ppl": head}


def split_rows(runs, factor: int = 32) -> dict[tuple, dict]:
    """{(dataset, train length, scheme): {seed: split_change}} over every run that can be split."""
    out = defaultdict(dict)
    for r in runs:
        s = split_change(r, factor)
        if s is not None:
            out[(r.dataset, r.train_length, r.scheme)][r.seed] = s
    return dict(out)
