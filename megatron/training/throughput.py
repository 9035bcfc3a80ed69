"""Training speed: tokens/s and MFU (model FLOPs utilisation), CUDA only for MFU.

Model FLOPs per token (PaLM, Chowdhery et al. 2022, appendix B), forward + backward:

    6 * N  +  12 * num_layers * hidden_size * seq_length

6N counts the matmuls with the N weights (2 forward, 4 backward); the second term is the
attention scores and the weighted sum (QK^T and AV), which have no weights. N is every parameter
of the model (the untied input embedding is a lookup, so this slightly overcounts), and activation
recomputation is not counted: MFU is the useful work, not the work done. MFU = achieved FLOP/s /
(peak FLOP/s per GPU * GPUs). The peak is the dense tensor-core number of the device named by
torch.cuda.get_device_name() for the training dtype; an unknown device gets no MFU.
"""
from __future__ import annotations

import torch

from megatron.device import collective_device

# (substring of the device name, bf16/fp16 dense peak, fp32 peak without TF32) in FLOP/s, from the
# vendors' data sheets. More specific names first: "H100 PCIe" before "H100".
PEAKS: tuple[tuple[str, float, float], ...] = (
    ("H200", 989e12, 67e12),
    ("GH200", 989e12, 67e12),
    ("H100 PCIe", 756e12, 51e12),
    ("H100", 989e12, 67e12),
    ("A100", 312e12, 19.5e12),
    ("A800", 312e12, 19.5e12),
    ("L40S", 362e12, 91.6e12),
    ("A10G", 70e12, 31.2e12),
    ("L4", 121e12, 30.3e12),
    ("V100", 125e12, 15.7e12),
    ("RTX 4090", 165e12, 82.6e12),
    ("RTX 3090", 71e12, 35.6e12),
    ("T4", 65e12, 8.1e12),
)


def peak_flops(device_name: str, dtype: torch.dtype) -> float | None:
    """Peak FLOP/s of one device for matmuls in `dtype`; None when the device is not in PEAKS."""
    for name, half, single in PEAKS:
        if name in device_name:
            return single if dtype == torch.float32 else half
    return None


def flops_per_token(num_params: int, num_layers: int, hidden_size: int, seq_length: int) -> float:
    """Forward + backward model FLOPs per trained token (the formula in the module docstring)."""
    return 6.0 * num_params + 12.0 * num_layers * hidden_size * seq_length


class Throughput:
    """tokens/s (global) and MFU for one optimizer step of `tokens_per_step` tokens."""

    def __init__(self, tokens_per_step: int, flops_per_token: float, world_size: int, peak: float | None):
        self.tokens = tokens_per_step
        self.flops = flops_per_token
        self.world_size = world_size
        self.peak = peak

    def metrics(self, seconds: float) -> dict[str, float]:
        seconds = max(seconds, 1e-9)
        out = {"tokens_per_sec": self.tokens / seconds}
        if self.peak:
            out["mfu"] = self.tokens * self.flops / seconds / (self.peak * self.world_size)
        return out


def full_parameter_count(model: torch.nn.Module, mpu, dp_size: int) -> int:
    """N of one whole model replica, from the pieces this rank holds (tensor-parallel shards,
    pipeline stages, ZeRO-3 partitions): a tensor-parallel replicated parameter counts once. A
    collective over all ranks."""
    # lazy: DeepSpeed picks (and logs) its accelerator on import: after init_distributed chose one
    from deepspeed.runtime.utils import is_model_parallel_parameter

    first_tp = mpu is None or mpu.get_model_parallel_rank() == 0
    local = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters()
                if first_tp or is_model_parallel_parameter(p))
    if not (torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1):
        return local

    total = torch.tensor([local], dtype=torch.int64, device=collective_device())
    torch.distributed.all_reduce(total)
    return int(total.item()) // dp_size


def for_device(device: torch.device, dtype: torch.dtype) -> tuple[float | None, str]:
    """(peak FLOP/s, a sentence for the start-up log saying what MFU uses or why it is absent)."""
    if device.type != "cuda":
        return None, "MFU not logged on CPU (no meaningful peak)"
    name = torch.cuda.get_device_name(device)
    peak = peak_flops(name, dtype)
    if peak is None:
        return None, f"MFU not logged: no peak FLOP/s known for {name!r} (megatron/training/throughput.py)"
    return peak, f"MFU against {peak / 1e12:g} TFLOP/s ({name}, {str(dtype).removeprefix('torch.')})"
