"""Config loader: NeoX key compatibility, merge order, one-error validation, paper configs."""
from __future__ import annotations

import glob
import os

import pytest
import yaml

from megatron.config import ConfigError, NeoXConfig, all_keys, load_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAPER = os.path.join(ROOT, "configs", "paper")

TINY = {"num-layers": 2, "hidden-size": 32, "num-attention-heads": 4, "seq-length": 64,
        "train-iters": 3, "train_micro_batch_size_per_gpu": 2}

# The paper's 2022 files, verbatim (chijames/KERPLE kerple_configs).
TRAIN_2022 = """# GPT-2 pretraining setup
{
   # parallelism settings ( you will want to change these based on your cluster setup, ideally scheduling pipeline stages
   # across the node boundaries )
   "pipe-parallel-size": 1,
   "model-parallel-size": 1,

   # model settings
   "num-layers": 12,
   "hidden-size": 768,
   "num-attention-heads": 12,
   "seq-length": 512,
   "seq-length-val": 2048,
   "max-position-embeddings": 512,
   "norm": "layernorm",
   "no-weight-tying": true,

   # these should provide some speedup but takes a while to build, set to true if desired
   "scaled-upper-triang-masked-softmax-fusion": false,
   "bias-gelu-fusion": false,


   # optimizer settings
   "optimizer": {
     "type": "Adam",
     "params": {
       "lr": 0.0006,
       "betas": [0.9, 0.999],
       "eps": 1.0e-8,
     }
   },
   "zero_optimization": {
    "stage": 0,
    "allgather_partitions": True,
    "allgather_bucket_size": 500000000,
    "overlap_comm": True,
    "reduce_scatter": True,
    "reduce_bucket_size": 500000000,
    "contiguous_gradients": True,
    "cpu_offload": False
  },

   # batch / data settings
   "train_micro_batch_size_per_gpu": 32,
   "data-impl": "mmap",
   "split": "949,50,1",

   # activation checkpointing
   "checkpoint-activations": true,
   "checkpoint-num-layers": 1,
   "partition-activations": true,
   "synchronize-each-layer": true,

   # regularization
   "gradient_clipping": 1.0,
   "weight-decay": 0.0,
   "hidden-dropout": 0.0,
   "attention-dropout": 0.0,

   # precision settings
   "fp16": {
     "enabled": True,
     "type": "bfloat16", # set bf16 as precision
     "loss_scale": 0,
     "loss_scale_window": 1000,
     "hysteresis": 2,
     "min_loss_scale": 1
   },

   # misc. training settings
   "fp32_allreduce": True, # without a patch to torch, bf16 models have to do the allreduce in fp32
   "train-iters": 50000,
   "lr-decay-iters": 50000,
   "distributed-backend": "nccl",
   "lr-decay-style": "cosine",
   "warmup": 0.01,
   "save-interval": 10000,
   "eval-interval": 1000,
   "eval-iters": 10,

   # logging
   "log-interval": 100,
   "steps_per_print": 10,
   "keep-last-n-checkpoints": 1,
   "wall_clock_breakdown": true,
}
"""
EX_EVAL_2022 = (TRAIN_2022.replace('"train_micro_batch_size_per_gpu": 32', '"train_micro_batch_size_per_gpu": 1')
                .replace('"train-iters": 50000', '"train-iters": 0').replace('"eval-iters": 10,', '"eval-iters": 320,'))
LOCAL_2022 = """# Suggested data paths when using GPT-NeoX locally
{
  "vocab-file": "data/gpt2-vocab.json",
  "merge-file": "data/gpt2-merges.txt",

  "checkpoint_validation_with_forward_pass": False,

  "tensorboard-dir": "tensorboard",
  "use_wandb": False,
  "wandb_host": "https://api.wandb.ai",
  "wandb_project": "neox"
}
"""
EXP_2022 = ('{"save": "kerple_log_github_1235_checkpoints", "load": "kerple_log_github_1235_checkpoints", '
            '"log-dir": "kerple_log_github_1235_logs", "seed": 1235, "data-path": '
            '"data/github/github_text_document", "pos-emb": "kerple_log"}\n')


def write(tmp_path, name, content) -> str:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
    return str(path)


@pytest.fixture
def paper_2022(tmp_path):
    return {name: write(tmp_path, name, text) for name, text in [
        ("local_setup.yml", LOCAL_2022), ("train.yml", TRAIN_2022), ("ex_eval.yml", EX_EVAL_2022),
        ("kerple_log_github_1235.yml", EXP_2022), ("lengths/length_4096.yml", '{"seq-length-val": 4096}\n')]}


def test_hyphen_and_underscore_spellings_are_one_key(tmp_path):
    a = load_config([write(tmp_path, "a/c.yml", TINY)])
    b = load_config([write(tmp_path, "b/c.yml", {k.replace("-", "_"): v for k, v in TINY.items()})])
    assert a.model.num_layers == b.model.num_layers == 2
    assert a.to_flat_dict() == b.to_flat_dict()


def test_later_file_wins_including_nested_dicts(tmp_path):
    first = write(tmp_path, "first.yml", {**TINY, "seq-length": 32, "zero_optimization": {"stage": 1, "overlap_comm": True}})
    second = write(tmp_path, "second.yml", {"seq-length": 128, "zero_optimization": {"stage": 0}})
    cfg = load_config([first, second])
    assert cfg.model.seq_length == 128
    assert cfg.optimizer.zero_optimization == {"stage": 0}  # replaced, not merged
    assert set(cfg.config_files) == {"first.yml", "second.yml"}


def test_overrides_apply_last(tmp_path):
    cfg = load_config([write(tmp_path, "a.yml", TINY)], overrides={"train-iters": 10, "pos_emb": "ALiBi"})
    assert cfg.training.train_iters == 10
    assert cfg.model.pos_emb == "alibi"  # choices are case-insensitive and normalised


def test_unknown_keys_reported_together_with_suggestions(tmp_path):
    path = write(tmp_path, "typo.yml", {**TINY, "num-layer": 3, "hiden_size": 5})
    with pytest.raises(ConfigError) as e:
        load_config([path])
    msg = str(e.value)
    assert len(e.value.problems) == 2
    assert "'num-layer'" in msg and "'num-layers'" in msg
    assert "'hiden_size'" in msg and "'hidden_size'" in msg
    assert msg.count("typo.yml") == 2


def test_bad_values_reported_together(tmp_path):
    path = write(tmp_path, "bad.yml", {**TINY, "hidden-size": "wide", "pos-emb": "kerpel", "warmup": 2,
                                        "no-weight-tying": "yes", "attention-window": 0})
    with pytest.raises(ConfigError) as e:
        load_config([path])
    assert len(e.value.problems) == 5
    msg = str(e.value)
    for piece in ["hidden-size = 'wide'", "expected int", "pos-emb = 'kerpel'", "kerple_log",
                  "warmup = 2", "<= 1", "no-weight-tying = 'yes'", "expected bool", "attention-window = 0"]:
        assert piece in msg
    assert "bad.yml" in msg


def test_cross_field_rules(tmp_path):
    path = write(tmp_path, "x.yml", {**TINY, "hidden-size": 30, "max-position-embeddings": 16,
                                      "save": "ckpt", "gpt_j_tied": True})
    with pytest.raises(ConfigError) as e:
        load_config([path])
    msg = str(e.value)
    assert "divisible by num-attention-heads" in msg
    assert "max-position-embeddings = 16" in msg and "learned" in msg
    assert "checkpoint-factor (or save-interval) is required when save is set" in msg
    assert "gpt-j-tied = True" in msg and "only applies with gpt-j-residual: true" in msg


def test_value_typing_rules(tmp_path):
    cfg = load_config([write(tmp_path, "t.yml", {**TINY, "init-method-std": 1, "min_lr": "6e-5",
                                                  "max-position-embeddings": None})])
    assert cfg.model.init_method_std == 1.0 and isinstance(cfg.model.init_method_std, float)
    assert cfg.optimizer.min_lr == 6e-5  # YAML 1.1 reads 6e-5 as a string
    assert cfg.model.max_position_embeddings == 64  # null -> seq-length
    assert cfg.model.intermediate_size == 128
    with pytest.raises(ConfigError, match="expected int"):
        load_config([], overrides={**TINY, "num-layers": True})


def test_missing_file_names_path_and_cwd(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config([str(tmp_path / "nope.yml")])
    assert "nope.yml" in str(e.value) and os.getcwd() in str(e.value)


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    path = write(tmp_path, "broken.yml", '{\n  "num-layers": 2,\n  "hidden-size": [1, 2\n}\n')
    with pytest.raises(ConfigError) as e:
        load_config([path])
    assert "broken.yml:" in str(e.value) and "YAML syntax error" in str(e.value)


def test_top_level_must_be_mapping(tmp_path):
    with pytest.raises(ConfigError, match="mapping"):
        load_config([write(tmp_path, "list.yml", "- 1\n- 2\n")])


def test_clip_grad_alias(tmp_path):
    assert load_config([], overrides={**TINY, "clip_grad": 0.5}).optimizer.gradient_clipping == 0.5
    with pytest.raises(ConfigError, match="must agree"):
        load_config([], overrides={**TINY, "clip_grad": 0.5, "gradient_clipping": 1.0})


def test_paper_2022_train_files(paper_2022):
    p = paper_2022
    cfg = load_config([p["local_setup.yml"], p["train.yml"], p["kerple_log_github_1235.yml"]])
    assert cfg.precision.dtype == "bf16"
    assert cfg.checkpoint.save_interval == cfg.checkpoint.interval == 10000
    assert cfg.training.seq_length_val == 2048
    assert cfg.optimizer.zero_optimization["stage"] == 0
    assert cfg.precision.fp32_allreduce is True
    assert cfg.logging.wall_clock_breakdown is True and cfg.logging.steps_per_print == 10
    assert cfg.checkpoint.keep_last_n_checkpoints == 1
    assert cfg.training.checkpoint_activations and cfg.training.partition_activations
    assert cfg.training.synchronize_each_layer
    assert cfg.data.split == "949,50,1"
    assert cfg.model.pos_emb == "kerple_log" and cfg.training.seed == 1235
    assert cfg.optimizer.type == "adam" and cfg.optimizer.lr == 6e-4
    assert cfg.logging.run_dir == "kerple_log_github_1235_checkpoints"
    ds = cfg.deepspeed_config(dp_world_size=1)
    assert ds["bf16"] == {"enabled": True} and "fp16" not in ds
    assert ds["train_batch_size"] == 32 and ds["gradient_accumulation_steps"] == 1
    assert "optimizer" not in ds and "scheduler" not in ds


def test_paper_2022_eval_then_length_file_wins(paper_2022):
    p = paper_2022
    files = [p["local_setup.yml"], p["ex_eval.yml"], p["kerple_log_github_1235.yml"]]
    assert load_config(files).training.seq_length_val == 2048
    cfg = load_config(files + [p["lengths/length_4096.yml"]])
    assert cfg.training.seq_length_val == 4096
    assert cfg.training.train_iters == 0 and cfg.training.eval_iters == 320


def _shipped_configs():
    return sorted(glob.glob(os.path.join(ROOT, "configs", "**", "*.y*ml"), recursive=True))


def _loads_alone(path) -> bool:
    try:
        load_config([path])
        return True
    except ConfigError:
        return False


@pytest.mark.parametrize("path", _shipped_configs(), ids=lambda p: os.path.relpath(p, ROOT))
def test_every_shipped_config_loads(path):
    """A full config loads alone; a fragment (e.g. a length file, or "add after quickstart.yml")
    loads on top of some full shipped config or of the paper's local_setup + train stack."""
    with open(path) as f:
        if not isinstance(yaml.safe_load(f), dict):
            pytest.skip("not a config mapping")
    if _loads_alone(path):
        return
    paper = [os.path.join(PAPER, "local_setup.yml"), os.path.join(PAPER, "train.yml")]
    stacks = [paper] + [[p] for p in _shipped_configs() if p != path and _loads_alone(p)]
    errors = []
    for stack in stacks:
        try:
            load_config([p for p in stack if p != path] + [path])
            return
        except ConfigError as e:
            errors.append(f"on top of {[os.path.basename(p) for p in stack]}: {e}")
    pytest.fail("loads neither alone nor as a fragment:\n" + "\n".join(errors))


def test_save_and_from_file_round_trip(tmp_path, paper_2022):
    cfg = load_config([paper_2022["train.yml"], paper_2022["kerple_log_github_1235.yml"]])
    out = tmp_path / "run" / "resolved_config.yml"
    cfg.save(out)
    assert out.read_text().startswith("#")
    again = NeoXConfig.from_file(out)
    assert again.to_flat_dict() == cfg.to_flat_dict()
    assert again == cfg


def test_replace_revalidates_and_rederives(tmp_path):
    cfg = load_config([], overrides=TINY)
    longer = cfg.replace(seq_length=128)
    assert longer.model.seq_length == 128 and longer.model.max_position_embeddings == 128
    assert cfg.model.seq_length == 64  # original untouched
    with pytest.raises(ConfigError):
        cfg.replace(num_layers=0)


@pytest.mark.parametrize("given,dp,expected", [
    ({"train_micro_batch_size_per_gpu": 4}, 2, (8, 4, 1)),
    ({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 3}, 2, (24, 4, 3)),
    ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}, 2, (32, 4, 4)),
    ({"train_batch_size": 32, "gradient_accumulation_steps": 2}, 4, (32, 4, 2)),
    ({"train_batch_size": 16}, 4, (16, 4, 1)),
    ({"train_batch_size": 24, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 3}, 2, (24, 4, 3)),
])
def test_batch_size_derivation(given, dp, expected):
    base = {k: v for k, v in TINY.items() if k != "train_micro_batch_size_per_gpu"}
    assert load_config([], overrides={**base, **given}).training.batch_sizes(dp) == expected


def test_batch_size_inconsistency():
    base = {k: v for k, v in TINY.items() if k != "train_micro_batch_size_per_gpu"}
    cfg = load_config([], overrides={**base, "train_batch_size": 24, "train_micro_batch_size_per_gpu": 4,
                                      "gradient_accumulation_steps": 3})
    with pytest.raises(ConfigError, match="inconsistent"):
        cfg.training.batch_sizes(4)
    with pytest.raises(ConfigError, match="train-micro-batch-size-per-gpu"):
        load_config([], overrides=base)


def test_precision_spellings():
    assert load_config([], overrides={**TINY, "bf16": {"enabled": True}}).precision.dtype == "bf16"
    fp16 = load_config([], overrides={**TINY, "fp16": {"enabled": True, "loss_scale": 0}})
    assert fp16.precision.dtype == "fp16"
    ds = fp16.deepspeed_config(1)
    assert ds["fp16"]["enabled"] and ds["fp16"]["loss_scale"] == 0 and "bf16" not in ds
    assert load_config([], overrides=TINY).precision.dtype == "fp32"
    with pytest.raises(ConfigError, match="both enabled"):
        load_config([], overrides={**TINY, "fp16": {"enabled": True}, "bf16": {"enabled": True}})


def test_save_interval_and_checkpoint_factor_are_one_setting():
    cfg = load_config([], overrides={**TINY, "save": "ck", "checkpoint_factor": 5})
    assert cfg.checkpoint.interval == 5
    with pytest.raises(ConfigError, match="differs from save-interval"):
        load_config([], overrides={**TINY, "save-interval": 4, "checkpoint-factor": 5})


def test_describe_mentions_what_matters(paper_2022):
    text = load_config([paper_2022["train.yml"], paper_2022["kerple_log_github_1235.yml"]]).describe()
    for piece in ["12 layers", "768", "kerple_log", "bf16", "cosine", "micro 32", "2048", "auto"]:
        assert piece in text


def test_all_keys_and_docs_up_to_date():
    keys = all_keys()
    names = [k[0] for k in keys]
    assert len(names) == len(set(names)) and "seq_length_val" in names
    from megatron.config.docs import render
    with open(os.path.join(ROOT, "docs", "config.md")) as f:
        assert f.read() == render(), "docs/config.md is stale: run python tools/gen_config_docs.py"


def test_same_key_twice_in_one_file_is_an_error(tmp_path):
    path = tmp_path / "twice.yml"
    path.write_text("num-layers: 2\nnum_layers: 4\nhidden-size: 8\n")
    with pytest.raises(ConfigError) as e:
        load_config([str(path)])
    assert "num-layers and num_layers" in str(e.value) and "keep one" in str(e.value)
