"""Compare a few runs' perplexity against length: one table and one figure (what make quickstart
ends with, for kerple against rotary).

    python tools/compare_runs.py runs/quickstart runs/quickstart_rotary --out runs/compare

Each RUN is a run directory (its eval/eval.json, where evaluate.py puts it) or an eval.json. Writes
OUT/compare.md (per length: each run's perplexity and its change from the run's train length, 1x)
and OUT/compare.png (the lengths on the paper's log2 axis, perplexity on an axis spanning at least
a factor 2 so a drift of a few percent looks like one, each line's change at its end). Runs scored
on different windows at a length are flagged there: their perplexities are not comparable.

--missing-ok (make quickstart): when a run's eval.json does not exist yet, say which, how to make it
(--missing-hint) and the command that then gives the comparison, and exit 0 without writing anything.
"""
from __future__ import annotations

import argparse
import os
import shlex

from megatron.atomic_io import atomic_output
from megatron.cli_args import ArgumentParser
from megatron.errors import UserError
from megatron.evaluation.outputs import checkpoint_name
from megatron.evaluation.results import parse_result


def eval_json_of(run: str) -> str:
    """A run directory's eval.json (run/eval/eval.json), or the file itself."""
    return run if run.endswith(".json") else os.path.join(run, "eval", "eval.json")


def run_label(run: str, result) -> str:
    """The run's name (its directory) and scheme: `quickstart (kerple_log)`."""
    path = os.path.abspath(run)
    name = checkpoint_name(os.path.dirname(os.path.dirname(path)) if run.endswith(".json") else path)
    return f"{name} ({result.scheme})"


def comparison_table(runs: dict) -> str:
    """Markdown: one row per length, each run's perplexity and change from its 1x length."""
    from megatron.evaluation.plots import reference_length  # lazy: matplotlib (through plots.py), as in main

    lengths = sorted({L for r in runs.values() for L in r.ppl})
    head = "| length | " + " | ".join(f"{label} | change" for label in runs) + " |"
    lines = [head, "|---:|" + "---:|---:|" * len(runs)]
    for L in lengths:
        cells = []
        for r in runs.values():
            ref, is_train = reference_length([r])
            if L in r.ppl:
                cells += [f"{r.ppl[L]:.3f}", f"{r.ppl[L] / r.ppl[ref] - 1:+.1%}"]
            else:
                cells += ["-", "-"]
        lines.append(f"| {L} | " + " | ".join(cells) + " |")
    refs = {label: reference_length([r]) for label, r in runs.items()}
    notes = ["change: from each run's perplexity at " + ", ".join(
        f"{ref} ({'its train length, 1x' if is_train else 'its shortest length'})" for ref, is_train in
        dict.fromkeys(refs.values())) + "."]
    first, *others = runs.values()
    differ = [L for L in lengths if any(L in o.ppl and L in first.ppl and o.same_text(L) != first.same_text(L)
                                        for o in others)]
    if differ:
        notes.append(f"Not comparable at lengths {', '.join(map(str, differ))}: the runs scored different windows "
                     "(corpus, split, data seed, window order or count differ).")
    else:
        notes.append("Every run scored the same windows at each length.")
    return "\n".join(lines) + "\n\n" + " ".join(notes) + "\n"


def equal_text_table(runs: dict) -> str:
    """Markdown: per length, each run's perplexity on the same spans at every length (--equal-text);
    '' when no run has it."""
    if not any(r.equal_text for r in runs.values()):
        return ""
    lengths = sorted({L for r in runs.values() for L in r.equal_text})
    lines = ["| length | " + " | ".join(runs) + " |", "|---:|" + "---:|" * len(runs)]
    for L in lengths:
        lines.append(f"| {L} | " + " | ".join(f"{r.equal_text[L]:.3f}" if L in r.equal_text else "-"
                                              for r in runs.values()) + " |")
    return ("\n## Perplexity on equal text\n\nEach run scores the same spans at every length, only the context "
            "before them changes (evaluate.py --equal-text); a run without it shows -.\n\n" + "\n".join(lines) + "\n")


def retrieval_tables(runs: dict) -> str:
    """Markdown: per retrieval task, each run's multiple-choice accuracy over all depths at each length
    (95% interval) and its effective length; '' when no run measured retrieval."""
    tasks = sorted({t for r in runs.values() for t in r.retrieval})
    out = []
    for task in tasks:
        have = {label: r.retrieval[task] for label, r in runs.items() if task in r.retrieval}
        lengths = sorted({int(L) for s in have.values() for L in s["by_length"]})
        lines = ["| length | " + " | ".join(runs) + " |", "|---:|" + "---:|" * len(runs)]
        for L in lengths:
            cells = []
            for label in runs:
                cell = have.get(label, {}).get("by_length", {}).get(str(L), {}).get("choice")
                cells.append("-" if not cell else f"{100 * cell['accuracy']:.0f}% ({100 * cell['interval'][0]:.0f}-"
                                                  f"{100 * cell['interval'][1]:.0f})")
            lines.append(f"| {L} | " + " | ".join(cells) + " |")
        eff = [str(have[label]["effective_length"]["choice"]) if label in have else "-" for label in runs]
        lines.append("| effective length | " + " | ".join(eff) + " |")
        spec = next(iter(have.values()))
        out.append(f"\n## Retrieval: {task}\n\nMultiple-choice accuracy over all depths (95% interval), chance "
                   f"{100 * spec['chance']:.0f}%; effective length: the longest length at which it, and every shorter "
                   f"length's, is at least {spec['threshold']:g}. None: below it already at the shortest.\n\n"
                   + "\n".join(lines) + "\n")
    return "".join(out)


def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories (their eval/eval.json) or eval.json files")
    p.add_argument("--out", required=True, help="where compare.md and compare.png go")
    p.add_argument("--missing-ok", action="store_true",
                   help="a run without its eval.json: say how to make it and exit 0, writing nothing")
    p.add_argument("--missing-hint", default=None, metavar="COMMAND",
                   help="with --missing-ok: the command that makes the missing run (e.g. make quickstart-rotary)")
    args = p.parse_args(argv)
    if len(args.runs) < 2:
        p.error("give at least two runs to compare")
    missing = [eval_json_of(r) for r in args.runs if not os.path.isfile(eval_json_of(r))]
    if missing:
        again = "python tools/compare_runs.py " + " ".join(map(shlex.quote, [*args.runs, "--out", args.out]))
        make = args.missing_hint or "evaluate.py --checkpoint RUN/checkpoints for each missing run"
        message = f"no comparison yet: {', '.join(missing)} does not exist. To compare, run {make}, then: {again}"
        if args.missing_ok:
            print(message)
            return 0
        raise UserError(message)
    # lazy: matplotlib; --help and the missing-run answer need none
    from megatron.evaluation.plots import PPL_MIN_SPAN, plot_ppl_vs_length

    runs = {}
    for run in args.runs:
        try:
            result = parse_result(eval_json_of(run))
        except ValueError as e:
            raise UserError(str(e)) from None
        result.scheme = run_label(run, result)  # one line per run, even for two runs of one scheme
        runs[result.scheme] = result
    if len(runs) < len(args.runs):
        raise UserError(f"two of {', '.join(args.runs)} have the same name and scheme; pass each run once")
    table = comparison_table(runs) + equal_text_table(runs) + retrieval_tables(runs)
    os.makedirs(args.out, exist_ok=True)
    md = os.path.join(args.out, "compare.md")
    with atomic_output(md, fsync=False) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write("# Perplexity against length\n\n" + table)
    png = plot_ppl_vs_length(list(runs.values()), os.path.join(args.out, "compare.png"),
                             title="perplexity vs length", min_span=PPL_MIN_SPAN)
    print(table + f"wrote {md}, {png}")
    return 0
