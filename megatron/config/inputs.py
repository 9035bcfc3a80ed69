"""The files a training run will read, checked before anything heavy starts.

A missing data prefix used to fail only after the DeepSpeed engine was built (84 s), with a long
traceback, and `--dry-run` passed. These checks are cheap (os.path only) and report every missing
input at once, as one ConfigError.

They are NOT part of loading a config: evaluate.py and generate.py load a checkpoint's resolved
config, whose data paths may not exist on this machine (users override them with -o data-path=...).
So they run where training starts: deepy.py (also with --dry-run) and train.py.

Two kinds are told apart: a file the config names that is not on this machine (kind INPUT: the
config itself is fine, `deepy.py --dry-run` on a laptop says "config OK; missing files only" and
exits with EXIT_MISSING_INPUTS) and a setting that cannot start a run anywhere (no data path,
a tokenizer without its vocab-file key): a config error like any other.
"""
from __future__ import annotations

import dataclasses
import os

from megatron.config.errors import INPUT, VALUE, ConfigError, MissingInputs, Problem
from megatron.config.paths import LATEST, tag_for
from megatron.config.schema import KEYS, canonical, hyphen
from megatron.config.validate import value_problem
from megatron.tokenizer.types import TOKENIZER_FILES

DATA_SUFFIXES = (".bin", ".idx")


def origin_of(cfg, name: str) -> str:
    """The file (or the -o origin) that set a key last; "default" when none did."""
    origin = "default"
    for entry in cfg._sources:
        if canonical(entry.key) == name:
            origin = entry.origin
    return origin


def _where(path: str) -> str:
    return "" if os.path.isabs(path) else f" (relative to {os.getcwd()})"


def data_prefix_problem(prefix: str) -> str | None:
    """What is missing of a .bin/.idx dataset prefix, or None when both files exist."""
    missing = [prefix + s for s in DATA_SUFFIXES if not os.path.isfile(prefix + s)]
    if not missing:
        return None
    hint = "build it with tools/preprocess_data.py (or tools/prepare_data.py), or fix the path"
    if prefix.endswith(DATA_SUFFIXES):
        hint = f"give the prefix without the suffix: {prefix[:-4]!r}"
    return f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing{_where(prefix)}; {hint}"


def reads_tokenizer(cfg) -> bool:
    """Training reads the tokenizer files only for the vocabulary size or the EOD id (eod-mask-loss,
    and the documents of reset-attention-mask / reset-position-ids)."""
    d = cfg.data
    return cfg.model.padded_vocab_size is None or d.eod_mask_loss or d.reset_attention_mask or d.reset_position_ids


def _tokenizer_problems(cfg) -> list[tuple[str, str, str]]:
    d = cfg.data
    out = []
    if d.tokenizer_type == "HFGPT2Tokenizer":
        out.append(("tokenizer_type", VALUE, "downloads GPT-2 from the Hugging Face hub, which this stack never does; "
                    "use GPT2BPETokenizer with vocab-file and merge-file"))
    for name in TOKENIZER_FILES.get(d.tokenizer_type, ()):
        path = getattr(d, name)
        if name == "merge_file" and (d.vocab_file or "").endswith(".tiktoken"):
            continue  # a .tiktoken vocab holds the merges itself
        if path is None:
            out.append((name, VALUE, f"tokenizer-type {d.tokenizer_type} needs {hyphen(name)}; it is not set"))
        elif not os.path.isfile(path):
            needs_eod = d.eod_mask_loss or d.reset_attention_mask or d.reset_position_ids
            skip = "" if needs_eod else " (or set padded-vocab-size so the tokenizer is not read)"
            out.append((name, INPUT, f"no such file{_where(path)}; {d.tokenizer_type} needs it{skip}"))
    return out


def _data_problems(cfg) -> list[tuple[str, str, str]]:
    d, out = cfg.data, []
    if d.single_path is not None:
        bad = data_prefix_problem(d.single_path)
        if bad:
            out.append(("data_path", INPUT, bad))
    for part in ("train", "valid", "test"):
        for i, prefix in enumerate(getattr(d, f"{part}_data_paths") or []):
            bad = data_prefix_problem(prefix)
            if bad:
                out.append((f"{part}_data_paths", INPUT, f"entry {i} {prefix!r}: {bad}"))
    if cfg.training.train_iters > 0 and not (d.data_path or d.train_data_paths):
        out.append(("train_iters", VALUE, "training needs data: set data-path (one prefix, split by `split`) or "
                    "train-data-paths; configs/quickstart.yml shows a working example"))
    return out


def same_dir(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and os.path.realpath(a) == os.path.realpath(b)


def _load_problems(cfg) -> list[tuple[str, str, str]]:
    """`load` must hold a checkpoint, except load == save with no checkpoint yet: NeoX's (and the
    quickstart's) way to say "resume this run if it was started before", a fresh start the first
    time. A load directory that is not the save directory is a checkpoint to start from: if it is
    missing, training would silently start from scratch, so that is an error."""
    c = cfg.checkpoint
    if not c.load:
        return []
    fresh_ok = same_dir(c.load, c.save)
    if os.path.exists(c.load) and not os.path.isdir(c.load):
        return [("load", INPUT, "is a file, not a checkpoint directory")]
    if not os.path.isdir(c.load):
        return [] if fresh_ok else [("load", INPUT, f"no such directory{_where(c.load)}; point it at a checkpoint "
                                     "directory (the one holding `latest`), or remove it to start from scratch")]
    if c.iteration is not None:
        step = os.path.join(c.load, tag_for(c.iteration))
        return [] if os.path.isdir(step) else [("iteration", INPUT, f"{step} does not exist")]
    if not fresh_ok and not os.path.isfile(os.path.join(c.load, LATEST)):
        return [("load", INPUT, "holds no checkpoint (no `latest` file); point it at the directory holding "
                 "`latest` and global_step<N>/, or set iteration")]
    return []


def _hostfile_problems(cfg) -> list[tuple[str, str, str]]:
    """A missing hostfile is no problem (DeepSpeed's runner trains on this machine: see
    megatron/launch/hosts.py), unless the config asks for more nodes than this one."""
    p = cfg.parallel
    if p.hostfile and not os.path.isfile(p.hostfile) and (p.num_nodes or 1) > 1:
        return [("hostfile", INPUT, f"no such file{_where(p.hostfile)}, and num-nodes {p.num_nodes} needs the "
                 "hosts it lists (DeepSpeed's runner would stop: no extra nodes without a hostfile); fix the path, "
                 "or remove num-nodes to train on this machine")]
    return []


def input_problems(cfg) -> list[Problem]:
    """Every input file or directory this training run needs and cannot find, and the settings
    without which it cannot start (kind VALUE)."""
    issues = _data_problems(cfg) + _load_problems(cfg) + _hostfile_problems(cfg)
    if reads_tokenizer(cfg):
        issues += _tokenizer_problems(cfg)
    out = []
    for name, kind, what in issues:
        problem = value_problem(name, getattr(getattr(cfg, KEYS[name].section), name), origin_of(cfg, name), what)
        out.append(dataclasses.replace(problem, kind=kind))
    return out


def inputs_error(problems: list[Problem]) -> ConfigError:
    """MissingInputs when only files are missing (the config is fine), else a ConfigError."""
    return (MissingInputs if all(p.kind == INPUT for p in problems) else ConfigError)(problems)


def check_inputs(cfg) -> None:
    """Raise one error naming every missing input (see the module docstring for where)."""
    problems = input_problems(cfg)
    if problems:
        raise inputs_error(problems)
