"""One map from precision names (fp32/bf16/fp16) to torch dtypes: megatron/config/precision.py."""
import re
from pathlib import Path

import pytest
import torch

from megatron.config.precision import DTYPE_NAMES, PrecisionConfig, torch_dtype

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name, dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16),
                                         ("fp16", torch.float16)])
def test_torch_dtype_of_each_name(name, dtype):
    assert torch_dtype(name) is dtype


def test_every_name_has_a_dtype_and_unknown_names_say_which():
    assert sorted(DTYPE_NAMES) == ["bf16", "fp16", "fp32"]
    with pytest.raises(ValueError, match="fp64.*fp32, bf16, fp16"):
        torch_dtype("fp64")


@pytest.mark.parametrize("overrides, dtype", [({}, torch.float32), ({"bf16": {"enabled": True}}, torch.bfloat16),
                                              ({"fp16": {"enabled": True, "type": "bfloat16"}}, torch.bfloat16),
                                              ({"precision": "fp16"}, torch.float16)])
def test_precision_config_torch_dtype(overrides, dtype):
    assert PrecisionConfig(**overrides).torch_dtype is dtype


def test_the_map_is_written_once():
    # a second `"bf16": torch.bfloat16` table anywhere drifts from this one
    pattern = re.compile(r"""["'](bf16|fp16|fp32)["']\s*:\s*torch\.(bfloat16|float16|float32|half|float)\b""")
    home = REPO / "megatron" / "config" / "precision.py"
    files = [p for d in ("megatron", "tools") for p in (REPO / d).rglob("*.py")] + list(REPO.glob("*.py"))
    copies = [f"{p.relative_to(REPO)}:{i}" for p in files if p != home
              for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not copies, f"use megatron.config.precision.torch_dtype instead of a copy of the map: {copies}"
