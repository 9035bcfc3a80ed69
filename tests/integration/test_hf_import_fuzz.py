"""Property test of the readers of untrusted files (issue 43): seeded random truncations, byte flips
and JSON type changes of every file tools/import_hf.py reads (config.json, model.safetensors and
its header, a sharded index and its shards, tokenizer.json) and of a checkpoint's manifest.json.

Each case ends in one of two ways, never a traceback and never a silent difference:
- refused: an exception that megatron.errors.handle (run_cli's handler) turns into one message (a
  UserError), and no output left behind;
- accepted: the exact result: the imported model's logits equal transformers' own on the same
  (damaged) directory, or, where transformers cannot load it either, the undamaged import's
  (the damage was in something neither model reads: a token id, the header's padding).
A bounded number of cases (CASES per file), so it runs in well under 30 s on two cores."""
import contextlib
import importlib.util
import io
import json
import os
import random
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")

from megatron.errors import UserError, handle  # noqa: E402
from tests.integration.test_hf_import import V, save_hf  # noqa: E402

CASES = 30  # per (model, kind of damage): 6 x 30 imports and 3 x 60 manifests
TOKENS = torch.randint(0, V, (2, 24), generator=torch.Generator().manual_seed(3))


IMPORT = importlib.import_module("megatron.interop.import_command").main


def run_import(src: str, out: str):
    """tools/import_hf.py's main through run_cli's handler: (exit code, message) or (0, None)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            IMPORT(["--input", src, "--output", out])
    except Exception as e:  # noqa: BLE001 - handle() re-raises (the test fails) anything but an expected failure
        assert isinstance(e, UserError), f"{type(e).__name__} is not a UserError: {e}"
        with contextlib.redirect_stderr(err):
            code = handle("import_hf.py", e)
        return code, err.getvalue()
    return 0, None


def our_logits(out: str) -> torch.Tensor:
    from megatron.checkpoint.load_model import load_checkpoint_model

    model, _, _ = load_checkpoint_model(out)
    with torch.no_grad():
        return model(TOKENS)


def hf_logits(src: str):
    """transformers' logits on `src`, or None when it does not load it cleanly (an error, or tensors
    missing / unexpected / of another shape, which it would initialise at random)."""
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            model, info = transformers.AutoModelForCausalLM.from_pretrained(
                src, dtype=torch.float32, output_loading_info=True)
            if any(info.get(k) for k in ("missing_keys", "mismatched_keys", "error_msgs")):
                return None
            with torch.no_grad():
                return model.eval()(TOKENS).logits
    except Exception:  # noqa: BLE001 - transformers refuses it: the oracle falls back on the undamaged import
        return None


def truncate(raw: bytes, rng: random.Random, header_end: int) -> bytes:
    return raw[:rng.randrange(0, len(raw))]


def flip(raw: bytes, rng: random.Random, header_end: int) -> bytes:
    """One byte XORed; in a safetensors file half in its header (the data's bytes are any values)."""
    at = rng.randrange(0, header_end) if rng.random() < 0.5 else rng.randrange(0, len(raw))
    out = bytearray(raw)
    out[at] ^= rng.randrange(1, 256)
    return bytes(out)


def _paths(value, path=()):
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, path + (i,))


def _other_type(value, rng: random.Random):
    choices = [None, True, 7, 0.5, "7", [7], {"x": 7}]
    return rng.choice([c for c in choices if type(c) is not type(value)])


def retype(raw: bytes, rng: random.Random, header_end: int) -> bytes:
    """One value of the JSON (a safetensors file's header) replaced by one of another JSON type."""
    if header_end < len(raw):  # safetensors: the header is the JSON
        n = int.from_bytes(raw[:8], "little")
        value, tail = json.loads(raw[8:8 + n]), raw[8 + n:]
    else:
        value, tail = json.loads(raw), None
    path = rng.choice(list(_paths(value))[1:])
    parent = value
    for k in path[:-1]:
        parent = parent[k]
    parent[path[-1]] = _other_type(parent[path[-1]], rng)
    text = json.dumps(value).encode()
    return text if tail is None else len(text).to_bytes(8, "little") + text + tail


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The undamaged directories and their imports: a Pythia (one safetensors, a tokenizer) and a
    sharded Llama."""
    from tests.integration.test_hf_untrusted import _word_tokenizer

    base = tmp_path_factory.mktemp("fuzz")
    _, pythia = save_hf(base, "pythia")
    _word_tokenizer(V).save(os.path.join(pythia, "tokenizer.json"))
    _, llama = save_hf(base, "llama-gqa-tied", max_shard_size="20KB")
    out = {}
    for src in (pythia, llama):
        assert run_import(src, src + "_ck") == (0, None)
        out[os.path.basename(src)] = (src, our_logits(src + "_ck"))
    return out


def _files(src: str) -> list[str]:
    """The files the importer reads (generation_config.json is transformers' generate()'s, not read)."""
    return sorted(f for f in os.listdir(src) if f.endswith((".json", ".safetensors")) and f != "generation_config.json")


@pytest.mark.parametrize("damage", [truncate, flip, retype], ids=lambda f: f.__name__)
@pytest.mark.parametrize("model", ["hf_pythia", "hf_llama-gqa-tied"])
def test_damaged_hf_files_end_in_a_message_or_the_exact_result(tmp_path, models, model, damage):
    src, undamaged = models[model]
    rng = random.Random(f"{model}-{damage.__name__}")
    names = _files(src)
    for case in range(CASES):
        name = names[case % len(names)]
        raw = open(os.path.join(src, name), "rb").read()
        header_end = 8 + int.from_bytes(raw[:8], "little") if name.endswith(".safetensors") else len(raw)
        work = tmp_path / f"{case}" / os.path.basename(src)
        shutil.copytree(src, work)
        damaged = damage(raw, rng, header_end)
        (work / name).write_bytes(damaged)
        out = str(tmp_path / f"{case}" / "out" / "ck")
        code, message = run_import(str(work), out)
        what = f"{name} {damage.__name__} case {case}"
        if code:
            assert message.count(": error: ") == 1 and "Traceback" not in message, (what, message)
            assert not os.path.exists(os.path.dirname(out)), f"{what}: a refused import left {out}"
            continue
        ours, theirs = our_logits(out), hf_logits(str(work))
        if theirs is None or name == "tokenizer.json":
            theirs = undamaged
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5, equal_nan=True, msg=lambda m, w=what: f"{w}: {m}")
        if name == "tokenizer.json":  # travels byte for byte
            assert open(os.path.join(out, "tokenizer", name), "rb").read() == damaged, what


@pytest.mark.parametrize("damage", [truncate, flip, retype], ids=lambda f: f.__name__)
def test_damaged_manifests_end_in_a_message_or_a_checked_step(tmp_path, models, damage):
    from megatron.checkpoint.manifest import MANIFEST, check_step, verify_file
    from megatron.checkpoint.safe_load import read_checkpoint_file

    src, _ = models["hf_pythia"]
    rng = random.Random(f"manifest-{damage.__name__}")
    for case in range(CASES * 2):
        step = tmp_path / f"{case}"
        shutil.copytree(os.path.join(src + "_ck", "global_step0"), step)
        raw = (step / MANIFEST).read_bytes()
        (step / MANIFEST).write_bytes(damage(raw, rng, len(raw)))
        try:
            check_step(str(step))
            verify_file(str(step / "mp_rank_00_model_states.pt"))
            read_checkpoint_file(str(step / "mp_rank_00_model_states.pt"))
        except Exception as e:  # noqa: BLE001 - handle() re-raises anything but an expected failure
            assert isinstance(e, UserError), f"case {case}: {type(e).__name__}: {e}"
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                assert handle("evaluate.py", e) != 0
            assert err.getvalue().count(": error: ") == 1
