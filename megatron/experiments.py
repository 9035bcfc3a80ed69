"""The experiment matrix: schemes x datasets x seeds -> one small YAML per run (the paper's
generate_ymls.py, generalised) and a matrix file listing each run's config files.

Each experiment YAML only sets what varies (pos-emb, seed, data-path, save/load, run-dir); it is
added after the shared base configs, so `deepy.py train.py <base...> <exp.yml>` trains it and
`evaluate.py --checkpoint <run>/checkpoints` evaluates it.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Run:
    name: str
    scheme: str
    dataset: str
    seed: int
    config: str  # the experiment YAML
    run_dir: str

    @property
    def checkpoints(self) -> str:
        return os.path.join(self.run_dir, "checkpoints")


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


def write_matrix(schemes, data: dict[str, str], seeds, out_dir: str, runs_root: str,
                 base_configs: list[str], extra: dict | None = None,
                 vocab_files: dict[str, str] | None = None) -> list[Run]:
    """Write <out_dir>/<scheme>_<dataset>_<seed>.yml for every combination and <out_dir>/matrix.json.
    vocab_files: {dataset: tokenizer file} for datasets with their own tokenizer (sets vocab-file)."""
    unknown_vocab = sorted(set(vocab_files or {}) - set(data))
    if unknown_vocab:
        raise ValueError(f"--vocab for datasets not in --data: {', '.join(unknown_vocab)}; "
                         f"the datasets are {', '.join(data)}")
    from megatron.positional.registry import scheme_names

    unknown = [s for s in schemes if s not in scheme_names()]
    if unknown:
        raise ValueError(f"unknown schemes {unknown}; choose from {', '.join(scheme_names())}")
    os.makedirs(out_dir, exist_ok=True)
    runs = []
    # Seed-major order: a matrix run in parts covers every scheme before repeating seeds.
    for seed in seeds:
        for dataset, prefix in data.items():
            for scheme in schemes:
                name = f"{scheme}_{dataset}_{seed}"
                run_dir = os.path.join(runs_root, name)
                exp = {"pos-emb": scheme, "seed": seed, "data-path": prefix, "run-dir": run_dir,
                       "save": os.path.join(run_dir, "checkpoints"), "load": os.path.join(run_dir, "checkpoints"),
                       "tensorboard-dir": os.path.join(run_dir, "tensorboard"), **(extra or {})}
                if dataset in (vocab_files or {}):
                    exp["vocab-file"] = vocab_files[dataset]
                path = os.path.join(out_dir, f"{name}.yml")
                with open(path, "w") as f:  # JSON is YAML (as generate_ymls.py wrote it)
                    json.dump(exp, f, indent=1)
                runs.append(Run(name, scheme, dataset, seed, path, run_dir))
    with open(os.path.join(out_dir, "matrix.json"), "w") as f:
        json.dump({"base_configs": base_configs, "runs": [r.__dict__ for r in runs]}, f, indent=1)
    return runs


def read_matrix(path: str) -> tuple[list[str], list[Run]]:
    if not os.path.isfile(path):
        raise ValueError(f"matrix file {path} does not exist; create it with tools/make_experiments.py")
    with open(path) as f:
        blob = json.load(f)
    return blob["base_configs"], [Run(**r) for r in blob["runs"]]
