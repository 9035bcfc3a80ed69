"""Perplexity on equal text (megatron/evaluation/equal_text.py): every length scores the same tokens,
only the context before them changes."""
import pytest
import torch

from megatron.errors import UserError
from megatron.evaluation import sweep as evaluate
from megatron.evaluation.equal_text import evaluate_equal_text, span_ends
from megatron.evaluation.strided import stream_tokens
from tests.conftest import write_token_dataset


class Recorder(torch.nn.Module):
    """Stands in for the model: records what each length reads and scores, every loss 1.0."""

    vocab_size = 128

    def __init__(self):
        super().__init__()
        self.seen: dict[int, list] = {}

    def token_losses(self, inp, lab):
        self.seen.setdefault(inp.shape[1], []).append((inp[0].tolist(), lab[0].tolist()))
        return torch.ones(lab.shape, dtype=torch.float32)


def test_every_length_scores_the_same_tokens_after_its_own_context(tmp_path):
    prefix = write_token_dataset(str(tmp_path / "text_document"), num_docs=200)
    model = Recorder()
    out = evaluate_equal_text(model, prefix, "80,10,10", "test", [16, 32, 64], 16, 5, seed=3)
    stream = stream_tokens(prefix, "80,10,10", "test", 3, span_ends(5, 64, 16)[-1]).tolist()
    scored = {L: [lab[-16:] for _, lab in reads] for L, reads in model.seen.items()}
    assert scored[16] == scored[32] == scored[64]  # the same targets at every length
    for L, reads in model.seen.items():
        for (inp, lab), e in zip(reads, span_ends(5, 64, 16)):
            assert inp == stream[e - L:e] and lab == stream[e - L + 1:e + 1]  # L tokens of context, ending at e
    assert out["16"]["tokens"] == out["64"]["tokens"] == 80 and out["32"]["loss"] == pytest.approx(1.0)
    assert out["context_before_scored"]["64"] == [48, 63]


def test_too_small_a_split_and_bad_combinations_are_refused(tmp_path):
    prefix = write_token_dataset(str(tmp_path / "text_document"), num_docs=20)
    with pytest.raises(ValueError, match="the test split of .* tokens"):  # evaluate.py prefixes --equal-text N
        evaluate_equal_text(Recorder(), prefix, "80,10,10", "test", [16, 1024], 16, 50, seed=3)
    args = evaluate.parse_args(["--checkpoint", str(tmp_path), "--equal-text", "4", "--stride", "8"])
    with pytest.raises(UserError, match="--equal-text scores beside the non-overlapping"):
        evaluate.check_command(args)
