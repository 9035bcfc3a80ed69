"""eval.py's task flags, defined once: eval.py parses them and deepy.py (megatron/launch/launcher.py)
accepts them and passes them on, so `python deepy.py eval.py CONFIG.yml --eval_tasks ...` works
as in GPT-NeoX (--eval_tasks, --eval_results_prefix are NeoX's names)."""
from __future__ import annotations

import argparse
import contextlib
import time

from megatron.cli_args import int_at_least
from megatron.errors import UserError

TITLE = "downstream tasks (eval.py; lm-evaluation-harness)"


def add_eval_flags(parser: argparse.ArgumentParser, required: bool = False,
                   batch_size: bool = True) -> argparse._ArgumentGroup:
    """`batch_size` False: the parser has its own --batch-size (evaluate.py)."""
    g = parser.add_argument_group(TITLE)
    g.add_argument("--eval_tasks", "--tasks", nargs="+", required=required, default=None, metavar="TASK",
                   help="harness tasks, groups or tags: kerple_local (offline) or e.g. lambada_openai hellaswag")
    g.add_argument("--eval_results_prefix", default=None,
                   help="write the results to <prefix>_eval_results_<date>.json (NeoX) instead of "
                        "harness.json in the output directory")
    g.add_argument("--max-length", type=int, default=None,
                   help="longest context in tokens (default: the training seq-length; longer extrapolates)")
    g.add_argument("--ruler-lengths", nargs="+", type=length_list, default=None, metavar="L",
                   help="lengths in tokens at which the RULER tasks (e.g. niah_single_1 ruler_vt) make and score their "
                        "prompts, comma- or space-separated, e.g. 1024,2048,4096 (default: --max-length, else the "
                        "training seq-length); --max-length then defaults to the longest")
    if batch_size:
        g.add_argument("--batch-size", type=int_at_least(1), default=1, help="sequences per forward (of equal length)")
    g.add_argument("--limit", type=float, default=None,
                   help="at most this many documents per task (or a fraction < 1): a smoke test, written to "
                        "harness_limitN.json, never over the full harness.json")
    g.add_argument("--num-fewshot", type=int_at_least(0), default=None, help="few-shot examples per prompt (default: the task's)")
    g.add_argument("--include-path", "--include_path", dest="include_paths", nargs="+", default=None, metavar="DIR",
                   help="directories of your own lm-eval task YAML files (lm-eval's --include_path); a single "
                        "task file can also be given to --tasks as its path")
    g.add_argument("--bootstrap-iters", type=int_at_least(0), default=None, metavar="N",
                   help="bootstrap resamples for the stderr of non-mean metrics, e.g. perplexity (default: "
                        "lm-eval's own, so stderr agrees with the stock harness; 0 skips stderr)")
    g.add_argument("--quiet", action="store_true", help="no progress bars (the harness's and the sweep's)")
    g.add_argument("--overwrite", action="store_true",
                   help="replace an earlier evaluation's results in the output directory (without it they are kept "
                        "and the evaluation is refused before anything is loaded)")
    return g


@contextlib.contextmanager
def progress_bars(enabled: bool):
    """`with progress_bars(not args.quiet):` no progress bar from any library inside when disabled.
    lm-eval, datasets and our own code each pass tqdm an explicit `disable=`, which TQDM_DISABLE
    cannot override, so every tqdm (their classes all derive from tqdm.std.tqdm) is built disabled."""
    if enabled:
        yield
        return
    from tqdm import std  # lazy: tqdm (~40 ms) only to silence bars; every entry point's --help imports this module

    init = std.tqdm.__init__

    def disabled(self, *args, **kwargs):
        kwargs["disable"] = True
        init(self, *args, **kwargs)

    std.tqdm.__init__ = disabled
    try:
        yield
    finally:
        std.tqdm.__init__ = init


def eval_argv(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[str]:
    """The eval flags that were given, as a command line for eval.py."""
    group = next(g for g in parser._action_groups if g.title == TITLE)
    out = []
    for action in group._group_actions:
        value = getattr(args, action.dest)
        if value is None or value == action.default:
            continue
        if action.nargs == 0:  # a switch (--quiet)
            out.append(action.option_strings[0])
            continue
        out += [action.option_strings[0], *map(str, value if isinstance(value, list) else [value])]
    return out


def length_list(text: str) -> str:
    """argparse type of --ruler-lengths: one or more integers >= 2, comma-separated; kept as text,
    so deepy.py passes it on as given (eval_argv); ruler_lengths() reads it."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isdigit() and int(p) >= 2 for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r} must be lengths in tokens (integers of at least 2), "
                                         "comma-separated, e.g. 1024,2048")
    return text


def ruler_lengths(values: list[str] | None) -> list[int] | None:
    """--ruler-lengths as integers, in the order given (lm-eval makes the documents of each length
    in turn, from one random stream: the order is part of what the prompts are)."""
    if values is None:
        return None
    lengths = [int(p) for v in values for p in v.split(",") if p.strip()]
    twice = sorted({n for n in lengths if lengths.count(n) > 1})
    if twice:
        raise UserError(f"--ruler-lengths names {', '.join(map(str, twice))} more than once; name each length once")
    return lengths


def limit_value(limit: float | None):
    """--limit as the harness takes it: a count (int) from 1 up, a fraction below 1."""
    return int(limit) if limit is not None and limit >= 1 else limit


def results_path(prefix: str | None) -> str | None:
    """NeoX's results file for --eval_results_prefix; None: harness.json in the output directory."""
    return f"{prefix}_eval_results_{time.strftime('%y-%m-%d-%H-%M')}.json" if prefix else None
