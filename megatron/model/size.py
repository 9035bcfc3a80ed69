"""The refusal of model sizes no machine holds, judged on the model's own parameter count
(GPTModel.parameter_terms: one layer built on the meta device, times the depth).

GPTModel refuses a size above MAX_PARAMETERS before it allocates anything (the only place every
path through which a model is built passes: training, evaluation, Hugging Face and NeoX imports of
configs from elsewhere); `deepy.py` refuses it earlier, naming the config file that set the key.
"""
from __future__ import annotations

from megatron.errors import UserError

# Above this many parameters no machine (or cluster) holds the model's training state: 1e13
# parameters are 160 TB of fp32 weights, gradients and Adam moments (16 bytes each). The largest
# models trained so far are ~2e12 parameters.
MAX_PARAMETERS = 10**13
TRAIN_BYTES_PER_PARAMETER = 16  # fp32 weight + gradient + Adam exp_avg + exp_avg_sq


def human_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB", "EB"):
        if n < 1000 or unit == "EB":
            return f"{n:.3g} {unit}" if unit != "B" else f"{n} B"
        n /= 1000
    raise AssertionError  # unreachable


def size_problem(terms: dict[str, int]) -> tuple[str, str] | None:
    """(key to blame, message) when a model of these parameter terms ({key that sizes it:
    parameters}, GPTModel.parameter_terms) cannot fit any machine."""
    total = sum(terms.values())
    if total <= MAX_PARAMETERS:
        return None
    blame = max(terms, key=terms.get)
    return blame, (f"the model would have at least {total:,} parameters ({total:.3g}; "
                   f"{human_bytes(total * TRAIN_BYTES_PER_PARAMETER)} of weights, gradients and Adam "
                   f"state at {TRAIN_BYTES_PER_PARAMETER} bytes each), more than any machine can hold; "
                   f"the limit is {MAX_PARAMETERS:.0e} parameters: reduce num-layers, hidden-size, "
                   "intermediate-size or the vocabulary")


class ModelTooLarge(UserError):
    """A model config whose model no machine holds (raised by GPTModel before it allocates)."""


def refuse_impossible_size(terms: dict[str, int], model_cfg, vocab_size: int) -> None:
    problem = size_problem(terms)
    if problem:
        key, what = problem
        value = vocab_size if key == "padded_vocab_size" else getattr(model_cfg, key)
        raise ModelTooLarge(f"{key.replace('_', '-')} = {value}: {what}")
