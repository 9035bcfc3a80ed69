"""Many eval.json files (directories, globs) as RunResults, one per (scheme, dataset, seed, train length):
the input of every table of the study. One file is read by megatron/evaluation/results.py.
"""
from __future__ import annotations

import glob
import os
import re

from megatron.evaluation.results import RunResult, parse_result


def expand_inputs(patterns) -> list[str]:
    """Files matched by glob patterns (`**` recursive) or, for a directory, every eval.json under it."""
    files = []
    for pat in patterns:
        if os.path.isdir(pat):
            files += glob.glob(os.path.join(glob.escape(pat), "**", "eval.json"), recursive=True)
        else:
            files += [f for f in glob.glob(pat, recursive=True) if os.path.isfile(f)]
    unique = sorted({os.path.realpath(f): f for f in files}.values())
    if not unique:
        raise ValueError(f"no result files matched {list(patterns)}; pass eval.json files, directories holding them, "
                         "or quoted glob patterns such as 'runs/**/eval.json'")
    return unique



def load_results(patterns, meta_from_path: str | None = None) -> list[RunResult]:
    """Every matched file as a RunResult; ValueError on a bad file or a repeated (scheme, dataset, seed)."""
    regex = None
    if meta_from_path:
        try:
            regex = re.compile(meta_from_path)
        except re.error as e:
            raise ValueError(f"--meta-from-path {meta_from_path!r} is not a valid regex ({e})") from e
    runs, seen = [], {}
    for path in expand_inputs(patterns):
        run = parse_result(path, regex)
        if run.key in seen:
            raise ValueError(f"two result files for scheme={run.scheme!r} dataset={run.dataset!r} seed={run.seed!r} "
                             f"train length={run.train_length!r}: "
                             f"{seen[run.key]} and {path}; add distinct `seed`/`dataset` keys to the JSON or use "
                             "--meta-from-path with (?P<seed>...) / (?P<dataset>...) groups")
        seen[run.key] = path
        runs.append(run)
    return runs
