"""The human summary `deepy.py --dry-run` prints: the settings that decide what a run does."""
from __future__ import annotations


def _or(value, fallback: str) -> str:
    return fallback if value is None else str(value)


def _lines(cfg) -> list[tuple[str, str]]:
    m, t, o, d, c = cfg.model, cfg.training, cfg.optimizer, cfg.data, cfg.checkpoint
    vocab = _or(m.padded_vocab_size, f"from tokenizer (multiple of {m.make_vocab_size_divisible_by})")
    decay = o.lr_decay_iters or (f"{o.lr_decay_fraction} x train-iters" if o.lr_decay_fraction
                                 else t.train_iters)
    data = d.single_path or (f"train {d.train_data_paths}, valid {d.valid_data_paths}, test {d.test_data_paths}"
                           if d.train_data_paths else "no data path set")
    prec = cfg.precision.dtype + (", fp32 all-reduce" if cfg.precision.fp32_allreduce else "")
    return [
        ("model", f"{m.num_layers} layers, hidden {m.hidden_size}, {m.num_attention_heads} heads "
                  f"(head dim {m.hidden_size // m.num_attention_heads}), {m.norm}, "
                  f"{'untied' if m.no_weight_tying else 'tied'} embeddings, vocab {vocab}"),
        ("block", _block(m)),
        ("sequence", f"train {m.seq_length}, validation/test {_or(t.seq_length_val, m.seq_length)}, "
                     f"max positions {m.max_position_embeddings}"),
        ("pos-emb", m.pos_emb),
        ("positions", _positions(d)),
        ("attention", f"backend {m.attention_backend}, window "
                      f"{_or(m.attention_window, 'none (full causal)')}, dropout {m.attention_dropout}"),
        ("precision", prec),
        ("parallel", f"pipe {cfg.parallel.pipe_parallel_size}, model {cfg.parallel.model_parallel_size}"
                     f", zero stage {o.zero_optimization.get('stage', 0)}"),
        ("batch", f"micro {_or(t.train_micro_batch_size_per_gpu, 'derived')}, grad-accum "
                  f"{_or(t.gradient_accumulation_steps, 'derived')}, global "
                  f"{_or(t.train_batch_size, 'micro x grad-accum x data-parallel')}"),
        ("optimizer", f"{o.type} lr {o.lr}, betas {o.betas}, eps {o.eps}, weight decay "
                      f"{o.weight_decay}, clip {o.gradient_clipping}"),
        ("schedule", f"{t.train_iters} iters; {o.lr_decay_style} decay over {decay} iters, warmup "
                     f"{o.warmup}, min lr {o.min_lr}"),
        ("eval", f"every {t.eval_interval} iters x {t.eval_iters} batches"),
        ("data", f"{data}; split {d.split}; tokenizer {d.tokenizer_type}"),
        ("save", "never" if c.save is None else f"{c.save} every {c.interval} iters, keep "
                 f"{_or(c.keep_last_n_checkpoints, 'all')} ({c.checkpoint_scale} scale)"),
        ("load", _or(c.load, "nothing") + (f" (iteration {c.iteration})" if c.iteration is not None else "")),
        ("run dir", _or(cfg.logging.run_dir, "-")),
    ]


def _positions(d) -> str:
    """What training's positions are (megatron/data/position_recipes.py); evaluation's are consecutive."""
    parts = []
    if d.reset_attention_mask or d.reset_position_ids:
        parts.append("packed documents: " + ", ".join(
            (["attention inside each document (reset-attention-mask)"] if d.reset_attention_mask else [])
            + (["positions restart at each document (reset-position-ids)"] if d.reset_position_ids else [])))
    if d.pos_random_max_length is not None:
        parts.append(f"randomized: sorted draw from [0, {d.pos_random_max_length}) per sequence (Ruoss et al. 2023)")
    if d.pos_skip_target_length is not None:
        parts.append(f"PoSE: {d.pos_skip_chunks} chunks with skips reaching {d.pos_skip_target_length} per sequence "
                     "(Zhu et al. 2024)")
    if not parts:
        return "consecutive from 0 (training and evaluation)"
    return "training " + "; ".join(parts) + "; evaluation consecutive from 0"


def describe(cfg) -> str:
    rows = _lines(cfg)
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _block(m) -> str:
    """The layer's shape: residual, MLP (activation and NeoX-rule widths), key/value heads."""
    width, inner = m.mlp_widths
    act = m.activation + (" (tanh)" if m.activation == "gelu" and m.bias_gelu_fusion else
                          " (onnx erf)" if m.activation == "gelu" and m.onnx_safe else "")
    mlp = f"mlp {act} {m.hidden_size}->{width}" + (f" (gated halves of {inner})" if m.gated_mlp else "")
    residual = ("parallel residual" + (", tied norms" if m.gpt_j_tied else "")) if m.gpt_j_residual \
        else "sequential residual"
    kv = f"{m.kv_heads} key/value heads (grouped-query)" if m.grouped_query else "multi-head"
    return f"{residual}, {mlp}, {kv}"
