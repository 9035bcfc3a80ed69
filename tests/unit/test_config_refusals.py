"""Config values that cannot work are refused at load, naming the key and the file: NaN/inf, a key
set twice in one file, a file that is not UTF-8. (Models no machine can hold: tests/unit/
test_model_size.py.)"""
from __future__ import annotations

import pytest

from megatron.config import ConfigError, load_config
from megatron.positional.registry import scheme_names

TINY = {"num-layers": 2, "hidden-size": 32, "num-attention-heads": 4, "seq-length": 64,
        "train-iters": 3, "train_micro_batch_size_per_gpu": 2}


def write(tmp_path, name, text) -> str:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


def tiny_text(**extra) -> str:
    return "".join(f"{k}: {v}\n" for k, v in {**TINY, **extra}.items())


def problems(paths, overrides=None) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(paths, overrides=overrides)
    return str(e.value)


# ---- NaN / inf ------------------------------------------------------------------------------
def test_nan_and_inf_refused_in_files_nested_and_overrides(tmp_path):
    path = write(tmp_path, "bad.yml", tiny_text(**{"weight-decay": ".inf"}) +
                 "optimizer: {type: Adam, params: {lr: .nan, betas: [0.9, 0.99]}}\n")
    err = problems([path], overrides={"min-lr": float("-inf")})
    assert "weight-decay" in err and "bad.yml" in err and "inf" in err
    assert "optimizer" in err and "params.lr" in err and "nan" in err
    assert "min-lr" in err and "-o on the command line" in err
    assert err.count("not a finite number") == 3


def test_nan_as_a_string_for_a_number_is_refused(tmp_path):
    path = write(tmp_path, "bad.yml", tiny_text(**{"hidden-dropout": "nan"}) +
                 "optimizer: {type: Adam, params: {lr: 'inf'}}\n")
    err = problems([path])
    assert "hidden-dropout" in err and "not a finite number" in err
    assert "params.lr must be a number > 0" in err


# ---- one file, read strictly ----------------------------------------------------------------
def test_same_key_twice_names_key_file_and_lines(tmp_path):
    path = write(tmp_path, "twice.yml", tiny_text() + "# later\nnum-layers: 4\n")
    err = problems([path])
    assert "'num-layers'" in err and "twice.yml" in err and "lines 1 and 8" in err


def test_same_key_twice_in_a_nested_mapping_and_json_style(tmp_path):
    path = write(tmp_path, "nested.yml", "{\n" + "".join(f'"{k}": {v},\n' for k, v in TINY.items()) +
                 '"optimizer": {"type": "Adam",\n  "params": {"lr": 0.001, "lr": 0.002}}\n}\n')
    err = problems([path])
    assert "'lr'" in err and "nested.yml" in err and "lines 9 and 9" in err


def test_non_utf8_file_names_file_and_byte_offset(tmp_path):
    text = tiny_text().encode() + b"# caf\xe9\n"
    path = write(tmp_path, "latin1.yml", text)
    err = problems([path])
    assert "latin1.yml" in err and "UTF-8" in err and f"byte {len(tiny_text().encode()) + 5}" in err
    assert "line 7" in err


# ---- attention backend names come from the attention registry -------------------------------
def test_unknown_attention_backend_is_refused_at_load_with_the_registry_names(tmp_path):
    from megatron.attention import backend_names

    path = write(tmp_path, "a.yml", tiny_text(**{"attention-backend": "sdpaa"}))
    text = problems([path])
    assert "attention-backend" in text and "a.yml" in text and "'sdpaa'" in text
    for name in ["auto", *backend_names()]:
        assert name in text


def test_every_registered_attention_backend_is_accepted():
    from megatron.attention import backend_names
    from megatron.config.fields import choices_of
    from megatron.config.schema import KEYS

    assert choices_of(KEYS["attention_backend"].field) == ("auto", *backend_names())
    for name in ["auto", *backend_names()]:
        assert load_config([], overrides={**TINY, "attention-backend": name}).model.attention_backend == name


def test_pos_emb_choices_are_the_positional_registry_names_only(monkeypatch):
    # no hand-kept list beside the registry: the names the scheme files register (read without
    # importing them, megatron/config/scheme_options.py), equal to the registry's
    import megatron.config.model as model_section
    from megatron.config.fields import choices_of
    from megatron.config.schema import KEYS

    assert choices_of(KEYS["pos_emb"].field) == tuple(sorted(scheme_names()))
    monkeypatch.setattr(model_section, "scheme_names", lambda: ["learned", "rotary"])
    assert choices_of(KEYS["pos_emb"].field) == ("learned", "rotary")


def test_a_mistyped_choice_gets_did_you_mean(tmp_path):
    """`pos-emb: kerple-log` (a hyphen for the underscore) and other near misses name the value meant."""
    msg = problems([write(tmp_path, "a.yml", tiny_text(**{"pos-emb": "kerple-log", "attention-backend": "sdap"}))])
    assert "pos-emb = 'kerple-log'" in msg and "did you mean 'kerple_log'?" in msg
    assert "attention-backend = 'sdap'" in msg and "did you mean 'sdpa'?" in msg
    far = problems([write(tmp_path, "b.yml", tiny_text(**{"pos-emb": "zzzzzz"}))])
    assert "did you mean" not in far and "expected one of" in far


def test_a_missing_config_file_gets_did_you_mean(tmp_path):
    """`--conf quickstart.yaml` where quickstart.yml exists (wrong extension, or a near name)."""
    write(tmp_path, "quickstart.yml", tiny_text())
    write(tmp_path, "quickstart_rotary.yml", tiny_text())
    msg = problems([str(tmp_path / "quickstart.yaml")])
    assert "config file not found" in msg and f"did you mean {tmp_path / 'quickstart.yml'}?" in msg
    msg = problems([str(tmp_path / "quikstart.yml")])  # a near name: the nearest first
    assert f"did you mean {tmp_path / 'quickstart.yml'} or {tmp_path / 'quickstart_rotary.yml'}?" in msg
    assert "did you mean" not in problems([str(tmp_path / "nothing_like_it.yml")])


# ---- shapes tensor parallelism cannot split (issue 43: 170 lines of split_with_sizes at step 0) ----
@pytest.mark.parametrize("extra, key, words", [
    ({"num-kv-heads": 1}, "num-kv-heads", "1 key/value heads cannot be split over model-parallel-size 2"),
    ({"intermediate-size": 66, "model-parallel-size": 4}, "intermediate-size",
     "the MLP width 66 is split over model-parallel-size 4"),
    ({"padded-vocab-size": 127}, "padded-vocab-size", "the vocabulary is split over model-parallel-size 2"),
    ({"num-attention-heads": 2, "hidden-size": 32, "model-parallel-size": 4}, "num-attention-heads",
     "must be divisible by model-parallel-size (4)"),
])
def test_a_shape_tensor_parallelism_cannot_split_is_refused_at_load(tmp_path, extra, key, words):
    path = write(tmp_path, "tp.yml", tiny_text(**{"model-parallel-size": 2, **extra}))
    err = problems([path])
    assert f"{key} = " in err and words in err and "tp.yml" in err, err


def test_shapes_tensor_parallelism_splits_evenly_load(tmp_path):
    load_config([write(tmp_path, "tp.yml", tiny_text(**{"model-parallel-size": 2, "num-kv-heads": 2,
                                                        "intermediate-size": 64, "padded-vocab-size": 128}))])


@pytest.mark.parametrize("key, value", [("lost-host-timeout", 0), ("distributed-timeout-minutes", -1),
                                        ("lost-host-timeout", "soon")])
def test_the_multi_host_timeouts_refuse_what_cannot_be_a_timeout(tmp_path, key, value):
    err = problems([write(tmp_path, "t.yml", tiny_text(**{key: value}))])
    assert f"{key} = " in err and "t.yml" in err, err
