"""One eval.json (schema kerple-eval/1) as a RunResult, keyed by (scheme, dataset, seed, train length):
what evaluate.py plots from the file it just wrote, and what the study reads many of
(study/results.py).

Where the keys come from, first match wins:
- scheme: the JSON's `label` (a matrix run's report name, study/experiments.py), else
  `pos_emb`, with " (window W)" appended when the run used a window (the
  windowed baseline of Fig. 5 is a different model of the same weights, so it is its own row);
- dataset: the JSON's `dataset`, else the `--meta-from-path` regex group `dataset`, else the
  basename of `data_path` without `_text_document`;
- seed: the JSON's `seed`, else the regex group `seed`, else None (a single run).
The regex may also give `scheme`, used only when the JSON lacks pos_emb. A run is keyed by
(scheme, dataset, seed, train length): the same scheme trained at two lengths is two runs.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field

import numpy as np

from megatron.evaluation.report import SCHEMA


@dataclass
class RunResult:
    path: str
    scheme: str
    dataset: str
    seed: int | str | None
    window: int | None
    train_length: int | None
    ppl: dict[int, float]  # length -> perplexity
    positionwise: dict[int, tuple[int, list[float]]] = field(default_factory=dict)  # length -> (bin_size, loss[])
    sec_per_step: float | None = None
    window_order: str | None = None  # evaluate.py's --window-order (None: written before it was recorded)
    data_seed: int | str | None = None
    short: dict[int, tuple[int, int]] = field(default_factory=dict)  # length -> (windows, asked) when fewer
    windows: dict[int, int] = field(default_factory=dict)  # length -> windows scored
    iteration: int | None = None  # the checkpoint's training step
    device_name: str | None = None  # e.g. 'cuda:0 (NVIDIA H100 80GB HBM3)' (None: written before it was recorded)
    corpus: tuple = ()  # (data path, split, mode, stride, min doc tokens, blockwise causal): what and how it scored
    equal_text: dict[int, float] = field(default_factory=dict)  # length -> perplexity on the same spans (--equal-text)
    retrieval: dict[str, dict] = field(default_factory=dict)  # task -> eval.json's retrieval section (--retrieval)

    def same_text(self, length: int) -> tuple:
        """Equal for two runs that scored the same tokens in the same way at this length: the windows are a
        function of the corpus, the evaluation length, the data seed, the window order and their count
        alone (megatron/data/gpt_dataset.build_eval_windows), whatever the runs' train lengths."""
        return self.corpus, self.data_seed, self.window_order, self.windows.get(length)

    def loss_over(self, length: int, start: int, stop: int | None = None) -> float | None:
        """Mean loss over the window's positions start..stop-1 (stop: the window's end) at this evaluation
        length, from the position-wise bins; None without a curve there or when a bound falls inside a bin."""
        if length not in self.positionwise:
            return None
        stop = length if stop is None else stop
        bin_size, losses = self.positionwise[length]
        if not 0 <= start < stop <= length or start % bin_size or stop % bin_size:
            return None
        return float(np.mean(losses[start // bin_size:stop // bin_size]))

    @property
    def key(self) -> tuple:
        return self.scheme, self.dataset, self.seed, self.train_length


def _normalise_seed(seed):
    if seed is None:
        return None
    try:
        return int(seed)
    except (TypeError, ValueError):
        return str(seed)


def _read_json(path: str) -> dict:
    try:
        with open(path) as f:
            rec = json.load(f)
    except (OSError, ValueError, RecursionError) as e:  # RecursionError: JSON nested thousands deep
        raise ValueError(f"{path}: not a readable JSON file ({e}); pass only evaluate.py's eval.json files") from None
    if not isinstance(rec, dict) or rec.get("schema") != SCHEMA:
        found = rec.get("schema") if isinstance(rec, dict) else type(rec).__name__
        raise ValueError(f"{path}: not a {SCHEMA} result (schema {found!r}); pass only evaluate.py's eval.json files")
    return rec


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def check_record(rec: dict, path: str) -> None:
    """The keys every reader of an eval.json relies on, each checked with the file and the key named:
    a non-empty `results` list of objects with an integer `length` >= 1 and a numeric `ppl` (`loss` a
    number, `windows`, `tokens` integers where present), and `positionwise` an object of {length: {bin_size,
    loss[]}}. One ValueError for the first problem found."""
    def bad(key: str, value, want: str) -> ValueError:
        return ValueError(f"{path}: {key} = {value!r}: {want}; this is not evaluate.py's eval.json as written "
                          "(regenerate it with evaluate.py, or leave the file out)")

    results = rec.get("results")
    if not isinstance(results, list):
        raise bad("results", results, "must be a list of per-length results")
    if not results:
        raise bad("results", results, "holds no length: there is nothing to compare")
    for i, r in enumerate(results):
        if not isinstance(r, dict):
            raise bad(f"results[{i}]", r, "must be an object")
        if not _is_int(r.get("length")) or r["length"] < 1:
            raise bad(f"results[{i}].length", r.get("length"), "must be an integer >= 1")
        if not _is_number(r.get("ppl")):
            raise bad(f"results[{i}].ppl", r.get("ppl"), "must be a number")
        if r.get("loss") is not None and not _is_number(r["loss"]):  # a run record may leave it out
            raise bad(f"results[{i}].loss", r["loss"], "must be a number")
        for key in ("windows", "tokens", "windows_requested"):
            if r.get(key) is not None and not _is_int(r[key]):
                raise bad(f"results[{i}].{key}", r[key], "must be an integer")
    positionwise = rec.get("positionwise", {})
    if not isinstance(positionwise, dict):
        raise bad("positionwise", positionwise, "must be an object {length: {bin_size, loss}}")
    for length, v in positionwise.items():
        if not (isinstance(v, dict) and _is_int(v.get("bin_size")) and isinstance(v.get("loss"), list)
                and all(_is_number(x) for x in v["loss"])):
            raise bad(f"positionwise[{length!r}]", v, "must be {bin_size: integer, loss: [numbers]}")


def parse_result(path: str, meta_regex: re.Pattern | None = None) -> RunResult:
    rec = _read_json(path)
    check_record(rec, path)
    groups = {}
    if meta_regex is not None:
        m = meta_regex.search(path)
        groups = {k: v for k, v in (m.groupdict() if m else {}).items() if v is not None}
    scheme = rec.get("label") or rec.get("pos_emb") or groups.get("scheme")
    if not scheme:
        raise ValueError(f"{path}: no pos_emb in the JSON and no `scheme` group from --meta-from-path")
    window = rec.get("window")
    if window is not None:
        scheme = f"{scheme} (window {window})"
    dataset = rec.get("dataset") or groups.get("dataset")
    if not dataset:
        dataset = os.path.basename(str(rec.get("data_path") or "unknown")).removesuffix("_text_document")
    seed = _normalise_seed(rec["seed"] if rec.get("seed") is not None else groups.get("seed"))
    try:
        ppl = {int(r["length"]): float(r["ppl"]) for r in rec["results"]}
        pw = {int(k): (int(v["bin_size"]), [float(x) for x in v["loss"]]) for k, v in rec.get("positionwise", {}).items()}
        short = {int(r["length"]): (int(r["windows"]), int(r["windows_requested"])) for r in rec["results"]
                 if r.get("windows_requested") is not None and int(r["windows"]) < int(r["windows_requested"])}
        windows = {int(r["length"]): int(r["windows"]) for r in rec["results"] if r.get("windows") is not None}
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: malformed results/positionwise entries ({e!r}); regenerate it with evaluate.py") from e
    bad = sorted(length for length, value in ppl.items() if not math.isfinite(value))
    if bad:  # an evaluation from before evaluate.py refused NaN losses: a mean over seeds would hide it
        raise ValueError(f"{path}: perplexity at lengths {bad} is not finite ({', '.join(str(ppl[x]) for x in bad)}); "
                         "re-run evaluate.py on that checkpoint (it now names the failing window) or leave the file out")
    try:
        equal = {int(k): float(v["ppl"]) for k, v in (rec.get("equal_text") or {}).items() if k.isdigit()}
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: malformed equal_text entries ({e!r}); regenerate it with evaluate.py") from e
    retrieval = rec.get("retrieval") or {}
    if not isinstance(retrieval, dict) or not all(isinstance(v, dict) and "by_length" in v for v in retrieval.values()):
        raise ValueError(f"{path}: malformed retrieval section; regenerate it with evaluate.py --retrieval")
    speed = (rec.get("train_speed") or {}).get("sec_per_step")
    return RunResult(path, scheme, dataset, seed, window, rec.get("train_length"), ppl, pw,
                     float(speed) if speed is not None else None, rec.get("window_order"),
                     _normalise_seed(rec.get("data_seed")), short, windows,
                     int(rec["iteration"]) if rec.get("iteration") is not None else None, rec.get("device_name"),
                     tuple(rec.get(k) for k in ("data_path", "split", "mode", "stride", "min_doc_tokens",
                                                "blockwise_causal")), equal, retrieval)
