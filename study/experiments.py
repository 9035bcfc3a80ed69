"""The experiment matrix: schemes x datasets x seeds -> one small YAML per run (the paper's
generate_ymls.py, generalised) and a matrix file listing each run's config files.

Each experiment YAML only sets what varies (pos-emb, seed, data-path, save/load, run-dir); it is
added after the shared base configs, so `deepy.py train.py <base...> <exp.yml>` trains it and
`evaluate.py --checkpoint <run>/checkpoints` evaluates it.
"""
from __future__ import annotations

import json
import os
from dataclasses import MISSING, dataclass, fields

from megatron.config.errors import did_you_mean
from megatron.errors import UserError


@dataclass(frozen=True)
class Run:
    name: str
    scheme: str
    dataset: str
    seed: int
    config: str  # the experiment YAML
    run_dir: str
    train_length: int | None = None  # set when the matrix varies the train length
    label: str | None = None  # the scheme's name in reports when it differs from the pos-emb name


    @property
    def checkpoints(self) -> str:
        return os.path.join(self.run_dir, "checkpoints")


# The scheme settings that are tied to the train length L, scaled from the papers' values:
# FIRE's threshold starts at L/4 (512 at train length 2048), xPos's scale base is L/2 (512 at 1024),
# T5's rpe-max-distance is L. T5 keeps 32 buckets, 16 of them exact; NeoX's max distance 128 at
# L = 512 gives every bucket training distances. Left at 128 with L = 64, buckets 27-31 (d >= 64)
# never receive a gradient. With max distance L every bucket does: the 16 log-spaced ones cover
# 16..L (from L >= 64 on they are at most one distance wide at d = 16, so none is skipped; L/2
# would skip bucket 20 at L = 64) and the last one, which every longer distance shares at
# evaluation, is trained on d = 59..63 at L = 64. The paper's ratio L/4 would equal the 16 exact
# buckets and leave no log-spaced range at all.
RPE_LABEL = "rpe (max distance L)"  # report name of T5 runs with the scaled buckets (v2's kept 128)


def length_settings(train_length: int, tokens_per_step: int | None = None,
                    sequences_per_step: int | None = None) -> dict:
    """The config keys of a run at this train length: sequence length, micro batch such that every
    step (hence every run of the same steps) sees tokens_per_step tokens, or sequences_per_step
    sequences (then the tokens grow with L, as when a paper keeps its batch of sequences), and the
    scaled scheme settings above."""
    if (tokens_per_step is None) == (sequences_per_step is None):
        raise ValueError("give the tokens per step or the sequences per step (one of them)")
    if train_length < 64 or train_length % 4:
        raise ValueError(f"train length {train_length} must be a multiple of 4 and at least 64 (below it "
                         "T5's log-spaced buckets skip distances)")
    if tokens_per_step and tokens_per_step % train_length:
        raise ValueError(f"train length {train_length} must divide the tokens per step ({tokens_per_step})")
    return {"seq-length": train_length, "max-position-embeddings": train_length,
            "train_micro_batch_size_per_gpu": sequences_per_step or tokens_per_step // train_length,
            "fire-init-threshold": train_length // 4, "xpos-scale-base": train_length // 2,
            "rpe-max-distance": train_length}


def parse_data(items: list[str], form: str = "NAME=DATA_PREFIX") -> dict[str, str]:
    """["code=data/code/code_text_document", ...] -> {name: prefix} (also --vocab's NAME=FILE)."""
    out = {}
    flag = "--data" if form == "NAME=DATA_PREFIX" else "--vocab"
    example = "code=data/code/code_text_document" if flag == "--data" else "code=data/code/tokenizer.json"
    for item in items:
        if "=" not in item:
            raise ValueError(f"{flag} {item!r} must look like {form} (e.g. {example})")
        name, prefix = item.split("=", 1)
        out[name.strip()] = prefix.strip()
    return out


ORDERS = {"seed": "seed-major: every scheme's first seed before any second one (the default)",
          "dataset": "dataset-major: one domain finished (seed-major inside it) before the next"}


def write_matrix(schemes, data: dict[str, str], seeds, out_dir: str, runs_root: str,
                 base_configs: list[str], extra: dict | None = None,
                 vocab_files: dict[str, str] | None = None, train_lengths: list[int] | None = None,
                 tokens_per_step: int | None = None, order: str = "seed",
                 sequences_per_step: int | None = None) -> list[Run]:
    """Write <out_dir>/<scheme>_<dataset>_<seed>.yml for every combination and <out_dir>/matrix.json.
    vocab_files: {dataset: tokenizer file} for datasets with their own tokenizer (sets vocab-file).
    train_lengths: also vary the train length (names <scheme>_<dataset>_L<L>_<seed>; each run gets
    length_settings(L, tokens_per_step or sequences_per_step)); within a seed the lengths run in the
    given order."""
    unknown_vocab = sorted(set(vocab_files or {}) - set(data))
    if unknown_vocab:
        raise ValueError(f"--vocab for datasets not in --data: {', '.join(unknown_vocab)}; "
                         f"the datasets are {', '.join(data)}")
    # lazy: torch (the schemes); make_experiments.py's and run_matrix.py's --help import this module
    from megatron.positional.registry import scheme_names

    unknown = [s for s in schemes if s not in scheme_names()]
    if unknown:
        raise ValueError(f"unknown schemes {unknown}; choose from {', '.join(scheme_names())}")
    if order not in ORDERS:
        raise ValueError(f"order {order!r}: choose {' or '.join(ORDERS)}")
    if train_lengths and not (tokens_per_step or sequences_per_step):
        raise ValueError("train lengths need tokens_per_step (the same training tokens at every length) "
                         "or sequences_per_step (the same sequences per step)")
    settings = {L: length_settings(L, tokens_per_step, sequences_per_step) for L in train_lengths or []}
    os.makedirs(out_dir, exist_ok=True)
    runs = []
    # Seed-major order: a matrix run in parts covers every scheme before repeating seeds.
    combos = [(dataset, seed) for seed in seeds for dataset in data]
    if order == "dataset":
        combos = [(dataset, seed) for dataset in data for seed in seeds]
    for dataset, seed in combos:
        for length in train_lengths or [None]:
            for scheme in schemes:
                name = f"{scheme}_{dataset}_{seed}" if length is None else f"{scheme}_{dataset}_L{length}_{seed}"
                run_dir = os.path.join(runs_root, name)
                exp = {"pos-emb": scheme, "seed": seed, "data-path": data[dataset], "run-dir": run_dir,
                       "save": os.path.join(run_dir, "checkpoints"), "load": os.path.join(run_dir, "checkpoints"),
                       "tensorboard-dir": os.path.join(run_dir, "tensorboard"), **settings.get(length, {}),
                       **(extra or {})}
                if dataset in (vocab_files or {}):
                    exp["vocab-file"] = vocab_files[dataset]
                path = os.path.join(out_dir, f"{name}.yml")
                with open(path, "w") as f:  # JSON is YAML (as generate_ymls.py wrote it)
                    json.dump(exp, f, indent=1)
                label = RPE_LABEL if scheme == "rpe" and length is not None else None
                runs.append(Run(name, scheme, dataset, seed, path, run_dir, length, label))
    with open(os.path.join(out_dir, "matrix.json"), "w") as f:
        json.dump({"base_configs": base_configs, "runs": [r.__dict__ for r in runs]}, f, indent=1)
    return runs


class MatrixError(UserError):
    """A matrix.json that cannot be run as it is (missing, not JSON, hand-edited wrongly)."""


MATRIX_FIX = "write it again with tools/make_experiments.py, or fix it by hand"


def read_matrix(path: str) -> tuple[list[str], list[Run]]:
    """(base configs, runs) of a matrix.json; MatrixError naming the file and every problem in it."""
    if not os.path.isfile(path):
        raise MatrixError(f"matrix {path} does not exist; create it with tools/make_experiments.py")
    try:
        with open(path) as f:
            blob = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        where = f"line {e.lineno}, column {e.colno}: {e.msg}" if isinstance(e, json.JSONDecodeError) else str(e)
        raise MatrixError(f"matrix {path} is not valid JSON ({where}); fix it by hand or write it again with "
                          "tools/make_experiments.py") from None
    except RecursionError:  # json has no depth limit of its own: a hand-made [[[[...]]]] file
        raise MatrixError(f"matrix {path} nests its values too deeply to be a matrix (tools/make_experiments.py "
                          "writes two levels); write it again with tools/make_experiments.py") from None
    base, runs, problems = _parse_matrix(blob)
    if problems:
        raise MatrixError(f"matrix {path}: {'; '.join(problems)} ({MATRIX_FIX})")
    return base, runs


def _unknown(word: str, known) -> str:
    hint = did_you_mean(word, known).removeprefix("; ")
    return f"unknown field {word!r}" + (f" ({hint})" if hint else "")


def _parse_matrix(blob) -> tuple[list[str], list[Run], list[str]]:
    """(base configs, runs, problems): every problem of a hand-edited matrix at once, each naming
    the run (index and name) and the field."""
    if not isinstance(blob, dict):
        return [], [], [f"must be a JSON object with base_configs and runs (as tools/make_experiments.py writes "
                        f"it), not a {type(blob).__name__}"]
    problems = [_unknown(k, ("base_configs", "runs")) for k in blob if k not in ("base_configs", "runs")]
    problems += [f"has no {key}" for key in ("base_configs", "runs") if key not in blob]
    base, runs = blob.get("base_configs", []), blob.get("runs", [])
    if not (isinstance(base, list) and all(isinstance(b, str) for b in base)):
        problems.append("base_configs must be a list of config file paths")
        base = []
    if not isinstance(runs, list):
        problems.append("runs must be a list of runs")
        runs = []
    elif "runs" in blob and not runs:
        problems.append("lists no run: nothing to run")
    parsed = []
    for i, r in enumerate(runs):
        run, found = _parse_run(r)
        name = f" ({r['name']})" if isinstance(r, dict) and "name" in r else ""
        problems += [f"run {i}{name}: {', '.join(found)}"] if found else []
        if run is not None:
            parsed.append((i, run))
    for field in ("name", "run_dir"):  # two runs in one directory: the second would resume the first
        seen: dict = {}
        for i, run in parsed:
            value = getattr(run, field)
            if value in seen:
                problems.append(f"runs {seen[value]} and {i} share the {field.replace('_', ' ')} {value} (one would "
                                "resume or skip the other's training)")
            seen.setdefault(value, i)
    return base, [run for _, run in parsed], problems


def _parse_run(r) -> tuple[Run | None, list[str]]:
    if not isinstance(r, dict):
        return None, [f"must be an object with the fields {', '.join(f.name for f in fields(Run))}"]
    known = {f.name: f for f in fields(Run)}
    problems = [_unknown(k, known) for k in r if k not in known]
    problems += [f"missing field {k}" for k, f in known.items() if k not in r and f.default is MISSING]
    for k, v in r.items():
        if k not in known or (v is None and known[k].default is None):
            continue
        kind = int if k in ("seed", "train_length") else str
        if not isinstance(v, kind) or isinstance(v, bool):
            problems.append(f"{k} {v!r} must be {'an integer' if kind is int else 'a string'}")
    return (None if problems else Run(**r)), problems
