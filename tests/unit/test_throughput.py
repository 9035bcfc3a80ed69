"""Throughput figures: the FLOP formula, the peak table, MFU, and the ETA format."""
import pytest
import torch

from megatron.process.logging import format_eta
from megatron.training.throughput import Throughput, flops_per_token, peak_flops


def test_flops_per_token_is_6n_plus_the_attention_term():
    # GPT-3 XL-like: N = 1.3e9, 24 layers, d 2048, S 2048 -> 6N + 12*L*d*S
    assert flops_per_token(1_300_000_000, 24, 2048, 2048) == 6 * 1.3e9 + 12 * 24 * 2048 * 2048


def test_peak_from_the_device_name_and_dtype():
    assert peak_flops("NVIDIA H100 80GB HBM3", torch.bfloat16) == 989e12
    assert peak_flops("NVIDIA H100 PCIe", torch.bfloat16) == 756e12  # not the SXM figure
    assert peak_flops("NVIDIA A100-SXM4-40GB", torch.float32) == 19.5e12
    assert peak_flops("Some Future GPU", torch.bfloat16) is None


def test_mfu_is_achieved_over_peak_flops():
    t = Throughput(tokens_per_step=1000, flops_per_token=1e9, world_size=2, peak=1e12)
    m = t.metrics(seconds=1.0)
    assert m["tokens_per_sec"] == 1000 and m["mfu"] == pytest.approx(1000 * 1e9 / (2 * 1e12))
    assert "mfu" not in Throughput(1000, 1e9, 1, None).metrics(1.0)  # CPU / unknown device


def test_eta_format():
    assert format_eta(59.6) == "00:01:00"
    assert format_eta(3 * 3600 + 62) == "03:01:02"
    assert format_eta(2 * 86400 + 5) == "2d 00:00:05"
