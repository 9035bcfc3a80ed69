"""The manifest of a checkpoint step: what was saved, so that a read can tell a complete,
unchanged step from a damaged one, and the weights from a config that no longer describes them.

    global_stepN/manifest.json
    {"format": "kerple-checkpoint-manifest/1", "tag": "global_step4", "iteration": 4,
     "layout": {"model_parallel_size": 2, "pipe_parallel_size": 0, "data_parallel_size": 1,
                "zero_stage": 1, "world_size": 2},
     "config": {"file": "resolved_config.yml", "model": {<the model keys the weights were built with>}},
     "files": {"mp_rank_00_model_states.pt": {"size": ..., "method": "zip-crc32", "digest": ...},
               "resolved_config.yml": {"size": ..., "method": "sha256", "digest": ...}, ...}}

Written LAST into the step, once every rank's files are there and before `latest` names it
(training's Checkpointer, and writer.py for merge / convert / import). Checked:

- once per load of a step (`check_step`: reader.read_tp1_state, training's resume): every file it
  lists is there with its size, no torch file it does not list lies beside them, and the config
  the step holds still has the model keys of the one that built the weights (an edit of anything
  else in resolved_config.yml is accepted with a note). Every difference in ONE message;
- on every read of a file (`verify_file`, from safe_load.safe_torch_load, which DeepSpeed's reads
  go through too): its content against its hash (digest.py), before torch unpickles it.

A step without a manifest (saved before checkpoints carried one, NeoX's, the KERPLE 2022
release) still loads: `check_step` says so in one line per load. This module imports no torch.
"""
from __future__ import annotations

import dataclasses
import json
import os

from megatron.atomic_io import atomic_output
from megatron.checkpoint.digest import content_problem, file_digest
from megatron.checkpoint.errors import CheckpointError
from megatron.checkpoint.layout import RESOLVED_CONFIG
from megatron.config import NeoXConfig
from megatron.config.untrusted_json import json_type, read_json
from megatron.errors import UserError

MANIFEST = "manifest.json"
FORMAT = "kerple-checkpoint-manifest/1"
_DAMAGED = ("the step is damaged or incomplete (a bad or unfinished copy, a failing disk): copy it again from "
            "where it was saved, or load another step (--iteration N / `iteration: N`)")
_verified: set[tuple] = set()  # file versions whose content matched, in this process


def run_layout(cfg, world_size: int = 1) -> dict:
    """The parallel layout a step is saved with, for the manifest."""
    mp, pp = cfg.parallel.model_parallel_size, cfg.parallel.pipe_parallel_size
    return {"model_parallel_size": mp, "pipe_parallel_size": pp,
            "data_parallel_size": max(1, world_size // (mp * max(pp, 1))),
            "zero_stage": int(cfg.optimizer.zero_optimization.get("stage", 0)), "world_size": world_size}


def model_keys(cfg) -> dict:
    """The keys that decide what function the weights compute: the model section and the tokenizer."""
    keys = {f.name: getattr(cfg.model, f.name) for f in dataclasses.fields(cfg.model)}
    keys["tokenizer_type"] = cfg.data.tokenizer_type
    return json.loads(json.dumps(keys, default=list))


def write_manifest(tag_dir: str, tag: str, layout: dict, model: dict | None, iteration: int | None = None) -> str:
    """Hash every file under `tag_dir` (the step `tag`, maybe still under its staging name) and
    write its manifest (atomically); returns its path. `model`: model_keys() of the config saved
    beside the weights (None without one)."""
    files = {}
    for root, _, names in os.walk(tag_dir):
        for name in names:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, tag_dir).replace(os.sep, "/")
            if rel != MANIFEST:
                files[rel] = file_digest(path, os.path.getsize(path))
    record = {"format": FORMAT, "tag": tag, "iteration": iteration,
              "layout": layout,
              "config": {"file": RESOLVED_CONFIG, "model": model} if model is not None else None,
              "files": dict(sorted(files.items()))}
    path = os.path.join(tag_dir, MANIFEST)
    with atomic_output(path) as tmp, open(tmp, "w") as f:
        json.dump(record, f, indent=1)
    return path


MAX_MANIFEST_BYTES = 64 << 20  # a 1,000-rank ZeRO step lists a few thousand files: ~1 MiB


def read_manifest(tag_dir: str) -> dict | None:
    """The manifest of `tag_dir`, or None when it has none. Every field check_step and verify_file
    use is checked here (a field of the wrong JSON type is one CheckpointError naming it, never an
    AttributeError further on)."""
    path = os.path.join(tag_dir, MANIFEST)
    try:
        record = read_json(path, "a checkpoint manifest", MAX_MANIFEST_BYTES, CheckpointError, _DAMAGED,
                           expect_type=None)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CheckpointError(f"{path} is not a readable checkpoint manifest ({e}); {_DAMAGED}") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT or not isinstance(record.get("files"), dict):
        raise CheckpointError(f"{path} is not a checkpoint manifest of format {FORMAT!r}; {_DAMAGED}")
    problem = _schema_problem(record)
    if problem:
        raise CheckpointError(f"{path} is not a well-formed checkpoint manifest: {problem}; {_DAMAGED}")
    return record


def _schema_problem(record: dict) -> str | None:
    """The first field of `record` that is not what write_manifest writes, or None."""
    def wrong(key: str, value, want: str) -> str:
        return f"{key} is {json_type(value)} ({str(value)[:60]}), not {want}"

    def whole(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    for key, want, ok in (("tag", "a string", lambda v: isinstance(v, str)),
                          ("iteration", "an integer or null", lambda v: v is None or whole(v)),
                          ("layout", "an object or null", lambda v: v is None or isinstance(v, dict)),
                          ("config", "an object or null", lambda v: v is None or isinstance(v, dict))):
        if key in record and not ok(record[key]):
            return wrong(key, record[key], want)
    config = record.get("config") or {}
    if not isinstance(config.get("model", {}) or {}, dict):
        return wrong("config.model", config["model"], "an object of model keys or null")
    for name, saved in record["files"].items():
        # a name is a path under the step (write_manifest walks it): never absolute, never `..`
        if os.path.isabs(name) or ".." in name.replace("\\", "/").split("/") or not name:
            return f"files names {name!r}, which is not a file inside the step"
        if not isinstance(saved, dict):
            return wrong(f"files[{name!r}]", saved, "an object with size, method and digest")
        if not whole(saved.get("size")) or saved["size"] < 0:
            return wrong(f"files[{name!r}].size", saved.get("size"), "a byte count")
        for key in ("method", "digest"):
            if not isinstance(saved.get(key), str):
                return wrong(f"files[{name!r}].{key}", saved.get(key), "a string")
    return None


def describe_layout(layout: dict) -> str:
    return (f"model-parallel-size {layout.get('model_parallel_size')}, pipe-parallel-size "
            f"{layout.get('pipe_parallel_size')}, ZeRO stage {layout.get('zero_stage')}, "
            f"{layout.get('world_size')} process(es)")


def check_step(tag_dir: str) -> dict | None:
    """Refuse a step that no longer matches its manifest (module docstring), naming every
    difference in one message; returns the manifest (None, after a one-line note, without one)."""
    record = read_manifest(tag_dir)
    if record is None:
        _note(f"[checkpoint] note: {tag_dir} has no {MANIFEST} (saved before checkpoints carried one, or by "
              "NeoX): loaded without checking its files for missing or changed ones")
        return None
    files, missing, changed = record["files"], [], []
    for name, saved in files.items():
        path = os.path.join(tag_dir, name)
        if not os.path.isfile(path):
            missing.append(name)
        elif os.path.getsize(path) != saved.get("size") and name != RESOLVED_CONFIG:
            changed.append(f"{name} has {os.path.getsize(path)} bytes, {saved.get('size')} when saved")
    extra = sorted(n for n in os.listdir(tag_dir) if n.endswith(".pt") and n not in files)
    problems = []
    if missing:
        problems.append(f"{_names(missing)} {'is' if len(missing) == 1 else 'are'} missing")
    problems += changed
    if extra:
        problems.append(f"{_names(extra)} {'is' if len(extra) == 1 else 'are'} not part of it (the manifest does "
                        "not list them; a file from another step or run changes what is read)")
    fixes = [_DAMAGED] if problems else []
    config = _config_problem(tag_dir, record)
    if config:
        problems.append(config)
        fixes.append("set those keys in resolved_config.yml back to the saved values (to evaluate with another "
                     "setting, pass -o KEY=VALUE to evaluate.py / generate.py, which refuses what the weights "
                     "cannot take) rather than editing the checkpoint")
    if problems:
        layout = record.get("layout") or {}
        raise CheckpointError(f"checkpoint {tag_dir} does not match its manifest ({os.path.join(tag_dir, MANIFEST)}; "
                              f"saved with {describe_layout(layout)}): {'; '.join(problems)}. Fix: "
                              + "; and ".join(fixes))
    return record


def _names(names: list[str], shown: int = 4) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _config_problem(tag_dir: str, record: dict) -> str | None:
    """resolved_config.yml against the config that built the weights: its model keys named when
    they changed; any other edit is accepted with a note."""
    saved = record["files"].get(RESOLVED_CONFIG)
    path = os.path.join(tag_dir, RESOLVED_CONFIG)
    if saved is None or not os.path.isfile(path) or content_problem(path, saved) is None:
        return None
    built = (record.get("config") or {}).get("model")
    if built is None:
        return f"{RESOLVED_CONFIG} was changed since the save"

    try:
        now = model_keys(NeoXConfig.from_file(path))
    except UserError as e:
        return f"{RESOLVED_CONFIG} was changed since the save and no longer loads ({str(e)[:300]})"
    diff = [f"{k.replace('_', '-')}: weights built with {built[k]!r}, {RESOLVED_CONFIG} now says {now.get(k)!r}"
            for k in built if now.get(k) != built[k]]
    if not diff:
        _note(f"[checkpoint] note: {path} was edited since the save, but not in the keys that describe the "
              "weights (model section, tokenizer-type): accepted")
        return None
    return (f"{RESOLVED_CONFIG} no longer describes the weights ({'; '.join(diff[:6])}"
            f"{f'; and {len(diff) - 6} more' if len(diff) > 6 else ''}): the model would be built as the "
            "edited config says and silently compute something else")


def verify_file(path: str) -> None:
    """Refuse `path` (a file about to be read) when its step's manifest says it was saved otherwise;
    nothing when the step has no manifest. Each file version is hashed once per process."""
    tag_dir, name = os.path.split(os.path.abspath(path))
    record = read_manifest(tag_dir)
    if record is None:
        return
    st = os.stat(path)
    version = (os.path.abspath(path), st.st_size, st.st_mtime_ns, st.st_ino)
    if version in _verified:
        return
    saved = record["files"].get(name)
    manifest = os.path.join(tag_dir, MANIFEST)
    if saved is None:
        raise CheckpointError(f"{path} is not part of checkpoint {tag_dir} as saved (its manifest {manifest} does "
                              "not list it): remove it, or copy the step again from where it was saved")
    problem = (f"it has {st.st_size} bytes, {saved.get('size')} when saved" if st.st_size != saved.get("size")
               else content_problem(path, saved))
    if problem:
        raise CheckpointError(f"{path} has changed since it was saved: {problem} (manifest {manifest}); {_DAMAGED}")
    _verified.add(version)


def _note(text: str) -> None:
    """A one-line note, from rank 0 only."""
    if os.environ.get("RANK", "0") == "0":
        print(text, flush=True)
