"""Tensor parallelism on CPU: 2 processes (gloo) with TP=2 must equal one TP=1 model.

Each worker builds the TP=1 model and its own TP=2 shard from the same seed, runs the same
tokens through both, and rank 0 compares the logits and every parameter gradient, the TP=2 ones
merged to full shape with the checkpoint merge (which also checks that replicated tensors
agree across ranks)."""
from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from megatron.process.distributed import free_port
from tests.conftest import TINY_MODEL, write_yaml

TOL = 1e-5
CASES = [("kerple_log", True), ("kerple_log", False), ("alibi", True), ("rpe", True), ("rotary", True),
         ("fire", True)]  # FIRE: per-head output rows split, the shared MLP layer's gradient all-reduced
# NeoX's block shapes under TP: GQA's [Q | K | V] and a gated MLP's [x | gate] are split group by
# group (each rank holds [Q_r | K_r | V_r], NeoX's per-rank layout), parallel residual sums both
# branches' all-reduced outputs.
BLOCKS = {"llama": {"activation": "swiglu", "num-kv-heads": 2, "intermediate-size": 96, "norm": "rmsnorm",
                    "use-bias-in-mlp": False},
          "pythia": {"gpt-j-residual": True, "bias-gelu-fusion": True, "num-kv-heads": 2}}


def _init_gloo(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)


def _run(model, tokens, labels):
    model.zero_grad(set_to_none=True)
    logits = model(tokens)
    model(tokens, labels=labels).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return logits.detach(), grads


def _compare_worker(rank: int, world: int, port: int, cfg_paths: dict, out: dict) -> None:
    from megatron.config import load_config
    from megatron.model import GPTModel
    from megatron.parallel import init_parallel, parallelize
    from megatron.parallel.merge import merge_state_dicts

    _init_gloo(rank, world, port)
    par = init_parallel(2)
    for name, path in cfg_paths.items():
        mcfg = load_config([path]).model
        torch.manual_seed(0)
        tokens = torch.randint(0, 128, (2, 32))
        labels = torch.randint(0, 128, (2, 32))
        torch.manual_seed(1)
        ref = GPTModel(mcfg, 128)
        torch.manual_seed(1)
        tp = parallelize(GPTModel(mcfg, 128), par)
        ref_logits, ref_grads = _run(ref, tokens, labels)
        tp_logits, tp_grads = _run(tp, tokens, labels)
        stats = tp.position_stats()  # collective: gathers every head
        shards = [None] * world
        dist.all_gather_object(shards, {"w": tp.state_dict(), "g": tp_grads})
        if rank == 0:
            w = merge_state_dicts([s["w"] for s in shards], mcfg)  # the config: exact tags and groups
            g = merge_state_dicts([s["g"] for s in shards], mcfg)
            out[name] = {
                "logits": (ref_logits - tp_logits).abs().max().item(),
                "weights": max((w[k] - v).abs().max().item() for k, v in ref.state_dict().items()),
                "grads": {k: (g[k] - v).abs().max().item() for k, v in ref_grads.items()},
                "missing": sorted(set(ref_grads) ^ set(g)),
                "stats": max([abs(stats[k] - v) for k, v in ref.position.stats().items()], default=0.0),
            }
    out["dropout_recompute"] = _dropout_recompute_diff(cfg_paths["kerple_log-untied"], par)
    dist.destroy_process_group()


def _dropout_recompute_diff(path: str, par) -> float:
    """TP=2 with attention dropout: activation checkpointing must replay the per-rank dropout
    masks, so its gradients equal those of the run without recomputation."""
    from dataclasses import replace

    from megatron.config import load_config
    from megatron.model import GPTModel
    from megatron.parallel import parallelize

    mcfg = replace(load_config([path]).model, attention_dropout=0.5, hidden_dropout=0.1)
    tokens = torch.randint(0, 128, (2, 32))
    grads = []
    for recompute in (False, True):
        torch.manual_seed(3)
        par.seed(5)
        model = parallelize(GPTModel(mcfg, 128, checkpoint_activations=recompute), par).train()
        model(tokens, labels=tokens).backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    return max((grads[0][n] - grads[1][n]).abs().max().item() for n in grads[0])


def _spawn(fn, *args, world: int = 2) -> float:
    start = time.perf_counter()
    mp.spawn(fn, args=(world, free_port(), *args), nprocs=world, join=True)
    return time.perf_counter() - start


def test_tp2_equals_tp1_logits_and_grads(tmp_path):
    paths = {}
    for pos, untied in CASES:
        name = f"{pos}-{'untied' if untied else 'tied'}"
        paths[name] = write_yaml(tmp_path / f"{name}.yml", {**TINY_MODEL, "pos-emb": pos, "no-weight-tying": untied})
    for block, over in BLOCKS.items():
        paths[f"kerple_log-{block}"] = write_yaml(tmp_path / f"{block}.yml",
                                                  {**TINY_MODEL, "pos-emb": "kerple_log", **over})
    out = mp.Manager().dict()
    seconds = _spawn(_compare_worker, paths, out)
    print(f"\n[tp] TP=2 vs TP=1, {len(paths)} models: {seconds:.1f} s")
    assert out.pop("dropout_recompute") < 1e-6
    assert set(out) == set(paths)
    for name, r in out.items():
        assert r["stats"] < 1e-6, (name, r["stats"])
        print(f"[tp] {name}: logits {r['logits']:.1e}, max grad diff {max(r['grads'].values()):.1e}")
        assert not r["missing"], (name, r["missing"])
        assert r["weights"] == 0.0, (name, r["weights"])  # same seed -> identical full weights
        assert r["logits"] < TOL, (name, r["logits"])
        bad = {k: v for k, v in r["grads"].items() if not v < TOL}
        assert not bad, (name, bad)
    assert "position.bias_p" in out["kerple_log-untied"]["grads"]
    assert "position.bias_a" in out["kerple_log-untied"]["grads"]


def _tags_worker(rank: int, world: int, port: int, out: dict) -> None:
    """Per TP=2 tensor: its split by the plan, the dim along which it is smaller than at TP=1, and
    the split megatron-core (or the plan, for the scheme) declared for DeepSpeed's grad norm."""
    from dataclasses import replace

    from megatron.config.model import ModelConfig
    from megatron.model import GPTModel
    from megatron.parallel import init_parallel, parallelize
    from megatron.parallel.plan import shard_dims

    _init_gloo(rank, world, port)
    par = init_parallel(2)
    base = ModelConfig(num_layers=1, hidden_size=32, num_attention_heads=4, seq_length=16, pos_emb="kerple_log")
    for name, over in {"kerple_log-untied": {"no_weight_tying": True}, "rpe": {"pos_emb": "rpe"},
                       "alibi-rmsnorm-no-bias": {"pos_emb": "alibi", "norm": "rmsnorm", "use_bias_in_mlp": False,
                                                 "use_bias_in_attn_linear": False}}.items():
        cfg = replace(base, **over)
        full = {k: tuple(t.shape) for k, t in GPTModel(cfg, 64).state_dict().items()}
        model = parallelize(GPTModel(cfg, 64), par)
        params = {id(p) for p in model.parameters()}
        dims, rows = shard_dims(model), {}
        for key, t in model.state_dict(keep_vars=True).items():
            smaller = [d for d, (a, b) in enumerate(zip(full[key], t.shape, strict=True)) if a != b]
            core = getattr(t, "partition_dim", None) if getattr(t, "tensor_model_parallel", False) else None
            rows[key] = (dims[key], smaller, core, id(t) in params)
        if rank == 0:
            out[name] = rows
    dist.destroy_process_group()


def test_tp2_tensors_split_as_the_plan_says():
    out = mp.Manager().dict()
    _spawn(_tags_worker, out)
    assert len(out) == 3
    for name, rows in out.items():
        assert sum(tag is not None for tag, *_ in rows.values()) >= 5, (name, rows)
        for key, (tag, smaller, core, is_param) in rows.items():
            assert smaller == ([] if tag is None else [tag]), (name, key, tag, smaller)
            if is_param:  # DeepSpeed's grad norm sums a split parameter over ranks
                assert core == tag, (name, key, tag, core)


def test_sequence_parallel_on_cpu_is_refused():
    from megatron.parallel import init_parallel

    if torch.cuda.is_available():
        pytest.skip("the CPU-only message")
    with pytest.raises(ValueError, match="sequence-parallel: true needs CUDA"):
        init_parallel(2, sequence_parallel=True)


def _validation_loss_tp1(ckpt: str) -> float:
    """The trainer's final validation loss, recomputed by one process from the (merged) checkpoint."""
    from megatron.checkpoint.load_model import load_checkpoint_model
    from megatron.data.loader import batch_loader
    from megatron.training.data_setup import build_datasets

    model, cfg, _ = load_checkpoint_model(ckpt)
    assert cfg.parallel.model_parallel_size == 1
    batch, micro, gas = cfg.training.batch_sizes(1)
    valid = build_datasets(cfg, batch)[1]
    losses = []
    with torch.no_grad():
        for b in batch_loader(valid, micro, gas, 0, 1, 0, cfg.training.eval_iters, 0):
            losses.append(model(b["tokens"], labels=b["labels"], loss_mask=torch.ones(b["tokens"].shape)).item())
    return sum(losses) / len(losses)


def test_tp2_checkpoint_evaluates_with_tp1(tmp_path, token_dataset, capsys):
    from megatron.checkpoint.reader import read_tp1_state
    from megatron.checkpoint.writer import write_tp1_checkpoint
    from megatron.process.metrics_file import read_metrics
    from tests.conftest import train_config_dict
    from tests.integration.fault_helpers import run_deepy, write_config

    ck = str(tmp_path / "ck")
    data = train_config_dict(tmp_path, token_dataset, train_iters=2, eval_iters=2, save=ck, save_interval=2,
                             **{"model-parallel-size": 2, "num-gpus": 2})
    start = time.perf_counter()
    out = run_deepy(write_config(tmp_path, "tp2", data))
    print(f"\n[tp] TP=2 training, 2 steps + save + eval: {time.perf_counter() - start:.1f} s")
    assert "| tp 2" in out, out[-2000:]
    step = os.path.join(ck, "global_step2")
    assert {"mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt"} <= set(os.listdir(step))
    tp2_loss = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "validation"][-1]["lm_loss"]

    # Automatic merge on load, with its one-line message.
    merged_loss = _validation_loss_tp1(ck)
    assert "[checkpoint] merged 2 tensor-parallel shards of" in capsys.readouterr().out
    assert merged_loss == pytest.approx(tp2_loss, rel=1e-5)

    # The tool: a TP=1 checkpoint on disk that loads without merging and scores the same.
    out_dir = str(tmp_path / "merged")
    write_tp1_checkpoint(read_tp1_state(ck), out_dir)
    assert os.listdir(os.path.join(out_dir, "global_step2")).count("mp_rank_00_model_states.pt") == 1
    assert not os.path.exists(os.path.join(out_dir, "global_step2", "mp_rank_01_model_states.pt"))
    client = read_tp1_state(out_dir).client
    assert client["args"]["model_parallel_size"] == 1
    assert _validation_loss_tp1(out_dir) == pytest.approx(tp2_loss, rel=1e-5)


def test_tp2_resume_with_dropout_matches_uninterrupted(tmp_path, token_dataset):
    """Each TP rank's own dropout stream (megatron/parallel/rng.py) is saved in its checkpoint
    shard and restored, so attention dropout after a resume draws the uninterrupted run's masks."""
    from tests.conftest import train_config_dict
    from tests.integration.fault_helpers import run_deepy, train_losses, write_config

    def conf(name, **over):
        data = train_config_dict(tmp_path, token_dataset, train_iters=4, eval_iters=1, attention_dropout=0.3,
                                 hidden_dropout=0.1, run_dir=str(tmp_path / name),
                                 **{"model-parallel-size": 2, "num-gpus": 2}, **over)
        return write_config(tmp_path, name, data)

    ck = str(tmp_path / "ck")
    run_deepy(conf("full", save=ck, save_interval=2))  # saving does not change the run
    run_deepy(conf("resumed", load=ck, iteration=2))  # resume from its step 2
    full, resumed = train_losses(tmp_path / "full"), train_losses(tmp_path / "resumed")
    assert sorted(resumed) == [3, 4]
    for it in (3, 4):
        assert resumed[it] == pytest.approx(full[it], abs=1e-6), (it, resumed[it], full[it])
