"""RoPE scaling for evaluating a rotary model beyond its train length L (`rotary-scaling`).

With s = rotary-scaling-factor and d = the rotated dims, the rotary frequencies theta_i =
base^(-2i/d) become:

- linear: theta_i / s. Position interpolation, Chen et al., "Extending Context Window of Large
  Language Models via Positional Interpolation", arXiv 2306.15595 (positions m -> m / s).
- ntk: base' = base * s^(d/(d-2)), NTK-aware scaling (bloc97, reddit r/LocalLLaMA, 2023): the
  lowest frequency is interpolated by s, the highest is kept. HF transformers' `dynamic` rope type
  is this with a length-dependent s; the static form is used here because a kv-cache's keys are
  rotated once, so frequencies that change with the length would not reproduce full-sequence logits.
- yarn: Peng et al., "YaRN: Efficient Context Window Extension of Large Language Models", arXiv
  2309.00071, "NTK-by-parts" plus attention temperature. A dimension turning r_i = L theta_i / 2pi
  times over L keeps theta_i when r_i > beta_fast, becomes theta_i / s when r_i < beta_slow, and is
  blended linearly in between; the ramp is laid over the dimension index between the (floored,
  ceiled) indices where r = beta_fast and r = beta_slow, as the authors' released code
  (jquesnelle/yarn) and HF transformers' `_compute_yarn_parameters` do. q and k are both multiplied by
  sqrt(1/t) = 0.1 ln(s) + 1 (so the logits by its square), the whole vectors as the paper says
  (HF scales cos/sin only, the same when rotary-pct is 1).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

KINDS = ("none", "linear", "ntk", "yarn")


@dataclass(frozen=True)
class RopeScaling:
    kind: str = "none"
    factor: float = 1.0
    original_length: int = 2048
    beta_fast: float = 32.0
    beta_slow: float = 1.0

    @classmethod
    def from_options(cls, options: dict, default_length: int) -> RopeScaling:
        """From the model config keys (PositionalSpec.options); checked here too, so a scheme built
        outside the config loader (tests, the HF export) refuses the same bad values."""
        kind = options.get("rotary_scaling", "none") or "none"
        out = cls(kind, float(options.get("rotary_scaling_factor", 1.0)),
                  int(options.get("rotary_scaling_original_length") or default_length),
                  float(options.get("rotary_yarn_beta_fast", 32.0)), float(options.get("rotary_yarn_beta_slow", 1.0)))
        if kind not in KINDS:
            raise ValueError(f"rotary-scaling {kind!r} is not one of {', '.join(KINDS)}")
        if not out.factor >= 1.0:
            raise ValueError(f"rotary-scaling-factor {out.factor} must be >= 1 (target length / train length)")
        if not out.beta_fast > out.beta_slow > 0:
            raise ValueError(f"rotary-yarn-beta-fast ({out.beta_fast}) must exceed rotary-yarn-beta-slow "
                             f"({out.beta_slow}) > 0")
        return out

    def inv_freq(self, inv_freq: torch.Tensor, dim: int, base: float) -> torch.Tensor:
        """The scaled frequencies (dim/2,) fp32 from the unscaled ones `inv_freq` = base^(-2i/dim)."""
        s = self.factor
        if self.kind == "none" or s == 1.0:
            return inv_freq
        if self.kind == "linear":
            return inv_freq / s
        exponent = torch.arange(0, dim, 2, dtype=torch.float32, device=inv_freq.device) / dim  # 2i/d
        if self.kind == "ntk":
            # base'^(-2i/d) / base^(-2i/d) = s^(-(2i/d) * d/(d-2)); d = 2 has one frequency (kept)
            return inv_freq * s ** (-exponent * dim / max(dim - 2, 1))
        ramp = self.yarn_ramp(dim, base, inv_freq.device)  # 0: keep theta_i, 1: theta_i / s
        return inv_freq / s * ramp + inv_freq * (1 - ramp)

    def yarn_ramp(self, dim: int, base: float, device=None) -> torch.Tensor:
        def index_turning(rotations: float) -> float:  # the i whose dimension turns `rotations` times over L
            return dim * math.log(self.original_length / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low = max(math.floor(index_turning(self.beta_fast)), 0)
        high = min(math.ceil(index_turning(self.beta_slow)), dim - 1)
        if low == high:
            high += 0.001  # one-index ramp: a step, not 0/0
        i = torch.arange(dim // 2, dtype=torch.float32, device=device)
        return ((i - low) / (high - low)).clamp(0, 1)

    def attention_factor(self) -> float:
        """The factor on q and on k (YaRN's sqrt(1/t)); 1 for the other kinds."""
        if self.kind != "yarn" or self.factor <= 1.0:
            return 1.0
        return 0.1 * math.log(self.factor) + 1.0
