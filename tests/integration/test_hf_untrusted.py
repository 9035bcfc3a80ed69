"""Issue 43: a Hugging Face model directory is untrusted input. Each case is what a user ran into,
run as the user runs it (tools/import_hf.py, generate.py): the transformers 4 spelling of a key is
read as transformers reads it (same perplexity), and every bad file is one line naming the file
and the key or tensor, exit != 0, no traceback, no output left behind; advice that is a command works."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

from megatron.interop.hf_families import families, family  # noqa: E402
from tests.conftest import ROOT  # noqa: E402
from tests.integration.test_hf_import import V, perplexity_hf, perplexity_ours, save_hf  # noqa: E402


def run(*args):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True)


def import_cli(src, out, *extra):
    return run("tools/import_hf.py", "--input", src, "--output", out, *extra)


def refused(proc, *words):
    """One message (plus the --debug hint), exit != 0, naming every word; returns the message."""
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ": error: " in ln]
    assert len(errors) == 1 and proc.stderr.strip().endswith("for the full traceback)"), proc.stderr
    for w in words:
        assert w in errors[0], (w, errors[0])
    return errors[0]


def edit_config(src, **keys):
    path = os.path.join(src, "config.json")
    cfg = json.load(open(path))
    for k, v in keys.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    json.dump(cfg, open(path, "w"), indent=1)


def rewrite_header(path, change):
    """Rewrite a .safetensors file's JSON header with change(header) applied; the data is kept."""
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    change(header)
    text = json.dumps(header).encode()
    open(path, "wb").write(len(text).to_bytes(8, "little") + text + raw[8 + n:])


def test_transformers4_spelling_of_rotary_base_gives_transformers_perplexity(tmp_path):
    """A Pythia-era config.json (rotary_emb_base, rotary_pct; no rope_parameters) is imported with its
    base, as transformers builds it (it was imported with base 10000, exit 0)."""
    _, src = save_hf(tmp_path, "pythia")
    edit_config(src, rope_parameters=None, rotary_emb_base=500, rotary_pct=0.25)
    hf = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    assert hf.config.rope_parameters["rope_theta"] == 500  # what transformers reads from that spelling
    proc = import_cli(src, str(tmp_path / "ck"))
    assert proc.returncode == 0, proc.stderr
    from megatron.checkpoint.load_model import load_checkpoint_model

    ours, cfg, _ = load_checkpoint_model(str(tmp_path / "ck"))
    assert cfg.model.rotary_emb_base == 500 and cfg.model.rotary_pct == 0.25
    tokens = torch.randint(0, V, (2, 40), generator=torch.Generator().manual_seed(1))
    assert abs(perplexity_ours(ours, tokens) / perplexity_hf(hf, tokens) - 1) < 1e-4


def test_spellings_that_disagree_are_refused_by_name(tmp_path):
    _, src = save_hf(tmp_path, "pythia")
    edit_config(src, rotary_emb_base=500)  # beside rope_parameters.rope_theta 10000 (transformers 5 reads that)
    refused(import_cli(src, str(tmp_path / "ck")), "config.json's rotary_emb_base is 500", "ignores it and uses 10000.0")
    assert not os.path.exists(tmp_path / "ck")


def test_an_integer_dtype_in_the_header_is_refused(tmp_path):
    """I32 declared for bytes written as F32 (same size): they were imported as integers."""
    _, src = save_hf(tmp_path, "pythia")
    rewrite_header(os.path.join(src, "model.safetensors"),
                   lambda h: h["gpt_neox.embed_in.weight"].update(dtype="I32"))
    refused(import_cli(src, str(tmp_path / "ck")), "gpt_neox.embed_in.weight in model.safetensors is I32",
            "config.json's dtype: float32")


def test_a_truncated_safetensors_file_is_one_line(tmp_path):
    _, src = save_hf(tmp_path, "pythia")
    path = os.path.join(src, "model.safetensors")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 100)
    refused(import_cli(src, str(tmp_path / "ck")), f"{path}: its header declares tensors up to byte {size:,}",
            "cut short", "download or copy it again")


def test_a_half_written_index_is_one_line(tmp_path):
    _, src = save_hf(tmp_path, "llama-gqa-tied", max_shard_size="20KB")
    index = os.path.join(src, "model.safetensors.index.json")
    text = open(index).read()
    open(index, "w").write(text[: len(text) // 2])
    refused(import_cli(src, str(tmp_path / "ck")), f"{index} is not readable as a sharded model's index: not valid JSON")


def test_a_shard_holding_the_wrong_tensors_is_named(tmp_path):
    _, src = save_hf(tmp_path, "llama-gqa-tied", max_shard_size="20KB")
    shards = sorted(f for f in os.listdir(src) if f.endswith(".safetensors"))
    shutil.copy(os.path.join(src, shards[0]), os.path.join(src, shards[1]))  # shard 2 is a copy of shard 1
    refused(import_cli(src, str(tmp_path / "ck")), f"{os.path.join(src, shards[1])} is not the shard",
            "which model.safetensors.index.json's weight_map puts in it", "puts in another shard")


def test_key_value_heads_that_do_not_divide_the_heads_name_config_json(tmp_path):
    _, src = save_hf(tmp_path, "llama-gqa-tied")
    edit_config(src, num_key_value_heads=3)
    msg = refused(import_cli(src, str(tmp_path / "ck")), "config.json's num_key_value_heads 3 does not divide "
                  "num_attention_heads 4")
    assert "command line" not in msg


def _word_tokenizer(n: int):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"<|endoftext|>": 0, **{f"w{i}": i for i in range(1, n)}}, unk_token="w1"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def test_a_tokenizer_larger_than_the_embedding_is_refused_and_the_advice_works(tmp_path):
    _, src = save_hf(tmp_path, "pythia")
    tok_path = os.path.join(src, "tokenizer.json")
    _word_tokenizer(V + 10).save(tok_path)
    msg = refused(import_cli(src, str(tmp_path / "ck")), f"{tok_path} has {V + 10} token ids but the embedding has "
                  f"{V} rows", "config.json's vocab_size; tensor gpt_neox.embed_in.weight in model.safetensors")
    assert not os.path.exists(tmp_path / "ck")
    advice = msg.split("import without one: ")[1].split(", then")[0].split()
    assert advice[0] == "mv" and subprocess.run(advice).returncode == 0
    proc = import_cli(src, str(tmp_path / "ck"))
    assert proc.returncode == 0 and "no tokenizer" in proc.stdout, proc.stderr

    _word_tokenizer(V - 28).save(tok_path)  # smaller: normal (padding rows), and said
    proc = import_cli(src, str(tmp_path / "ck2"))
    assert proc.returncode == 0 and f"tokenizer: {V - 28} tokens; the embedding's {V} rows include 28" in proc.stdout


def test_an_import_without_a_tokenizer_makes_generate_ask_for_one(tmp_path):
    _, src = save_hf(tmp_path, "pythia")
    assert import_cli(src, str(tmp_path / "ck")).returncode == 0
    ck = str(tmp_path / "ck")
    msg = refused(run("generate.py", "--checkpoint", ck, "--prompt", "w1 w2", "--max-new-tokens", "2"),
                  f"{ck} has no tokenizer", "-o tokenizer-type=HFTokenizer -o vocab-file=")
    assert "vocab.json" not in msg
    tok_path = str(tmp_path / "tokenizer.json")
    _word_tokenizer(V).save(tok_path)
    proc = run("generate.py", "--checkpoint", ck, "-o", "tokenizer-type=HFTokenizer", "-o", f"vocab-file={tok_path}",
               "--prompt", "w1 w2", "--max-new-tokens", "2", "--greedy")
    assert proc.returncode == 0, proc.stderr


def test_a_manifest_entry_of_the_wrong_type_is_one_line(tmp_path):
    _, src = save_hf(tmp_path, "pythia")
    assert import_cli(src, str(tmp_path / "ck")).returncode == 0
    path = tmp_path / "ck" / "global_step0" / "manifest.json"
    record = json.loads(path.read_text())
    record["files"]["mp_rank_00_model_states.pt"] = "1234"
    path.write_text(json.dumps(record))
    refused(run("generate.py", "--checkpoint", str(tmp_path / "ck"), "--prompt", "x"),
            f"{path} is not a well-formed checkpoint manifest: files['mp_rank_00_model_states.pt'] is a string")


@pytest.mark.parametrize("damage", ["config", "header", "tokenizer"])
def test_a_refused_import_leaves_nothing(tmp_path, damage):
    _, src = save_hf(tmp_path, "pythia")
    if damage == "config":
        edit_config(src, hidden_size="32")
    elif damage == "header":
        rewrite_header(os.path.join(src, "model.safetensors"),
                       lambda h: h["gpt_neox.final_layer_norm.bias"].update(shape=[33]))
    else:
        open(os.path.join(src, "tokenizer.json"), "w").write('{"version": "1.0", "model": ')
    out = tmp_path / "new" / "ck"
    refused(import_cli(src, str(out)))
    assert not (tmp_path / "new").exists() and sorted(os.listdir(tmp_path)) == ["hf_pythia"]


@pytest.mark.parametrize("arch", list(families()))  # a new family file is checked by being there
def test_every_key_of_transformers_config_class_is_mapped_or_inert_with_its_defaults(arch):
    """hf_config.py's INERT and each family's defaults against transformers' own class: a field it
    adds (a new transformers) fails here instead of being ignored by the import; our defaults are its defaults."""
    import dataclasses

    from megatron.interop.hf_config import INERT

    defaults = family(arch).defaults
    cls = getattr(transformers, family(arch).config_class)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    mapped = set(defaults) | {"rope_parameters"}
    assert not set(fields) - mapped - INERT, set(fields) - mapped - INERT
    made = cls()
    for key, value in defaults.items():
        if key in ("rope_theta", "partial_rotary_factor"):
            got = made.rope_parameters.get(key, 1.0)
        elif key in ("num_key_value_heads", "head_dim") and value is None:
            continue  # None: "derived from the heads", which __post_init__ fills in
        else:
            got = fields[key].default
        assert got == value, (key, got, value)
