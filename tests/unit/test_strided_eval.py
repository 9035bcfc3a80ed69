"""Strided (sliding-window) evaluation: every target scored exactly once, with the right context."""
import pytest
import torch

from megatron.evaluation.strided import strided_windows


@pytest.mark.parametrize("n,length,stride", [(100, 32, 8), (100, 32, 32), (7, 32, 4), (65, 16, 5)])
def test_every_target_scored_once_with_bounded_context(n, length, stride):
    windows = strided_windows(n, length, stride)
    scored = []
    for start, end, first in windows:
        assert 0 <= start <= first < end <= n and end - start <= length
        scored += list(range(first, end))
        if first > 0:  # later windows carry as much context as fits
            assert end - start == min(length, end)
    assert scored == list(range(n))


def test_stride_out_of_range():
    with pytest.raises(ValueError, match="stride 40 must be between 1 and the window length 32"):
        strided_windows(100, 32, 40)


def test_stride_equal_length_is_non_overlapping_eval(tiny_config):
    """With S = L the strided loss equals the mean over non-overlapping windows."""
    from megatron.model import GPTModel

    torch.manual_seed(0)
    model = GPTModel(tiny_config().model, 128).eval()
    tokens = torch.randint(0, 128, (1, 65))
    total = 0.0
    for start, end, first in strided_windows(64, 16, 16):
        total += model.token_losses(tokens[:, start:end], tokens[:, start + 1:end + 1])[0, first - start:].sum()
    direct = model.token_losses(tokens[:, :64].view(4, 16), tokens[:, 1:65].unfold(1, 16, 16).reshape(4, 16))
    assert float(total / 64) == pytest.approx(float(direct.mean()), abs=1e-5)
