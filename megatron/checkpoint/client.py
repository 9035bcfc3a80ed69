"""The client state saved next to the weights in mp_rank_00_model_states.pt (NeoX's keys)."""
from __future__ import annotations

# Model-shape arguments NeoX asserts equal on load (check_checkpoint_args), plus the scheme.
# What a loader checks against its own config before reading weights: the shape, and the block
# options that change the function without changing any shape (a Pythia checkpoint read with
# gpt-j-residual false loads every tensor and is another model). Old checkpoints lack the later
# keys in their args; a missing key is not compared (compat.differences).
CHECKED_ARGS = ("num_layers", "hidden_size", "num_attention_heads", "pos_emb", "gpt_j_residual", "gpt_j_tied",
                "activation", "bias_gelu_fusion", "onnx_safe", "num_kv_heads", "mlp_multiple_of", "norm")


def model_args(cfg, padded_vocab_size: int) -> dict:
    """The `args` entry: what a loader checks against its own config."""
    args = {k: getattr(cfg.model, k) for k in CHECKED_ARGS}
    args["max_position_embeddings"] = cfg.model.max_position_embeddings
    args["padded_vocab_size"] = padded_vocab_size
    args["model_parallel_size"] = cfg.parallel.model_parallel_size
    args["make_vocab_size_divisible_by"] = cfg.model.make_vocab_size_divisible_by
    args["tokenizer_type"] = cfg.data.tokenizer_type
    return args


def client_state(blob: dict) -> dict:
    """A model-states file's dict without the weights and optimizer state."""
    return {k: v for k, v in blob.items() if k not in ("module", "optimizer")}
