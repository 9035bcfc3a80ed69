"""RoPE scaling for evaluating a rotary model beyond its train length L (`rotary-scaling`).

With s = rotary-scaling-factor and d = the rotated dims, the rotary frequencies theta_i =
base^(-2i/d) become:

- linear: theta_i / s. Position interpolation, Chen et al., "Extending Context Window of Large
  Language Models via Positional Interpolation", arXiv 2306.15595 (positions m -> m / s).
- ntk: base' = base * s^(d/(d-2)), NTK-aware scaling (bloc97, reddit r/LocalLLaMA, 2023): the
  lowest frequency is interpolated by s, the highest is kept. Static: a kv-cache's keys are rotated
  once, and with one s for every length, decoding reproduces full-sequence logits.
- dynamic: ntk with s' = s * n / L - (s - 1) for a call whose longest position is n - 1 (s' = 1, no
  scaling, while n <= L): dynamic NTK (emozilla, reddit r/LocalLLaMA, 2023), HF transformers'
  `dynamic` rope type. A full-sequence forward of n tokens equals transformers' on those n tokens;
  a kv-cache's keys keep the frequencies of the call that added them (transformers' generate()
  does the same), so decoding past L does not reproduce full-sequence logits.
- yarn: Peng et al., "YaRN: Efficient Context Window Extension of Large Language Models", arXiv
  2309.00071, "NTK-by-parts" plus attention temperature. A dimension turning r_i = L theta_i / 2pi
  times over L keeps theta_i when r_i > beta_fast, becomes theta_i / s when r_i < beta_slow, and is
  blended linearly in between; the ramp is laid over the dimension index between the (floored,
  ceiled) indices where r = beta_fast and r = beta_slow, as the authors' released code
  (jquesnelle/yarn) and HF transformers' `_compute_yarn_parameters` do. q and k are both multiplied by
  sqrt(1/t) = 0.1 ln(s) + 1 (so the logits by its square), the whole vectors as the paper says
  (HF scales cos/sin only, the same when rotary-pct is 1).
- llama3: Llama 3.1's scaling (Meta, "The Llama 3 Herd of Models", arXiv 2407.21783; Meta's
  reference `apply_scaling`, HF transformers' `llama3` rope type). With wavelength lambda_i =
  2pi / theta_i: theta_i is kept when lambda_i < L / high_freq_factor, becomes theta_i / s when
  lambda_i > L / low_freq_factor, and in between is blended (1 - g) theta_i / s + g theta_i with
  g = (L / lambda_i - low_freq_factor) / (high_freq_factor - low_freq_factor).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .options import Option

KINDS = ("none", "linear", "ntk", "dynamic", "yarn", "llama3")

KIND = Option(
    "rotary_scaling", str, "none",
    "RoPE scaling for evaluation beyond the train length (pos-emb rotary): linear = position "
    "interpolation (Chen et al. 2023, frequencies / factor), ntk = NTK-aware base "
    "base * factor^(d/(d-2)) (bloc97), dynamic = ntk with factor * n / L - (factor - 1) in place of "
    "factor for a call of n > L tokens (transformers' dynamic NTK; L = rotary-scaling-original-length), "
    "yarn = YaRN's NTK-by-parts ramp and attention temperature 0.1 ln(factor) + 1 on q and k (Peng et "
    "al. 2023), llama3 = Llama 3.1's by-wavelength scaling (rotary-llama3-low/high-freq-factor). Set it "
    "on an existing checkpoint with evaluate.py -o rotary-scaling=yarn -o rotary-scaling-factor=16; "
    "tools/import_hf.py sets it from a Hugging Face config's rope_scaling.", choices=KINDS)
FACTOR = Option(
    "rotary_scaling_factor", float, 1.0,
    "The RoPE scaling factor s (target length / rotary-scaling-original-length; for dynamic, the "
    "slope of the length-dependent factor), used when rotary-scaling is not none.", ge=1)
ORIGINAL_LENGTH = Option(
    "rotary_scaling_original_length", int | None, None,
    "The length the rotary model was trained at (YaRN's and Llama 3's "
    "original_max_position_embeddings, dynamic's max_position_embeddings); defaults to seq-length, so "
    "an evaluation that sets rotary-scaling keeps the checkpoint's train length.", ge=1,
    default_from="seq_length")
BETA_FAST = Option(
    "rotary_yarn_beta_fast", float, 32.0,
    "YaRN: dimensions turning more than beta-fast times over the original length keep their "
    "frequency (extrapolation); must exceed rotary-yarn-beta-slow.", gt=0)
BETA_SLOW = Option(
    "rotary_yarn_beta_slow", float, 1.0,
    "YaRN: dimensions turning fewer than beta-slow times over the original length are fully "
    "interpolated (frequency / factor).", gt=0)
LOW_FREQ_FACTOR = Option(
    "rotary_llama3_low_freq_factor", float, 1.0,
    "llama3: frequencies whose wavelength exceeds original length / low-freq-factor are divided "
    "by the factor (Llama 3.1: 1).", gt=0)
HIGH_FREQ_FACTOR = Option(
    "rotary_llama3_high_freq_factor", float, 4.0,
    "llama3: frequencies whose wavelength is below original length / high-freq-factor are kept, "
    "those between the two bounds blended (Llama 3.1: 4); must exceed rotary-llama3-low-freq-factor.", gt=0)
OPTIONS = (KIND, FACTOR, ORIGINAL_LENGTH, BETA_FAST, BETA_SLOW, LOW_FREQ_FACTOR, HIGH_FREQ_FACTOR)


def scaling_problems(values: dict) -> list[tuple[str, str]]:
    """(key, what is wrong) for the rules between the scaling options, in the model config's keys:
    the config refuses them with the rest, a scheme built outside it (tests, the HF export) raises."""
    out = []
    kind = KIND.read(values) or "none"
    if kind != "none" and values.get("pos_emb", "rotary") != "rotary":
        out.append(("rotary_scaling", f"applies to pos-emb rotary only (pos-emb is {values['pos_emb']}); "
                    "set rotary-scaling: none"))
    if BETA_FAST.read(values) <= BETA_SLOW.read(values):
        out.append(("rotary_yarn_beta_fast", f"must exceed rotary-yarn-beta-slow ({BETA_SLOW.read(values)})"))
    if HIGH_FREQ_FACTOR.read(values) <= LOW_FREQ_FACTOR.read(values):
        out.append(("rotary_llama3_high_freq_factor",
                    f"must exceed rotary-llama3-low-freq-factor ({LOW_FREQ_FACTOR.read(values)})"))
    return out


@dataclass(frozen=True)
class RopeScaling:
    kind: str = KIND.default
    factor: float = FACTOR.default
    original_length: int = 2048
    beta_fast: float = BETA_FAST.default
    beta_slow: float = BETA_SLOW.default
    low_freq_factor: float = LOW_FREQ_FACTOR.default
    high_freq_factor: float = HIGH_FREQ_FACTOR.default

    @classmethod
    def from_options(cls, options: dict, default_length: int) -> RopeScaling:
        """From the model config keys (PositionalSpec.options); checked here too, so a scheme built
        outside the config loader (tests, the HF export) refuses the same bad values."""
        kind = KIND.read(options) or "none"
        if kind not in KINDS:
            raise ValueError(f"rotary-scaling {kind!r} is not one of {', '.join(KINDS)}")
        factor = float(FACTOR.read(options))
        if not factor >= 1.0:
            raise ValueError(f"rotary-scaling-factor {factor} must be >= 1 (target length / train length)")
        bad = [p for p in scaling_problems({**options, "rotary_scaling": kind}) if p[0] != "rotary_scaling"]
        if bad:
            raise ValueError("; ".join(f"{key.replace('_', '-')} {msg}" for key, msg in bad))
        return cls(kind, factor, int(ORIGINAL_LENGTH.read(options) or default_length),
                   float(BETA_FAST.read(options)), float(BETA_SLOW.read(options)),
                   float(LOW_FREQ_FACTOR.read(options)), float(HIGH_FREQ_FACTOR.read(options)))

    @property
    def length_dependent(self) -> bool:
        """True when the frequencies depend on the call's length (`inv_freq`'s `length`)."""
        return self.kind == "dynamic"

    def inv_freq(self, inv_freq: torch.Tensor, dim: int, base: float,
                 length: torch.Tensor | None = None) -> torch.Tensor:
        """The scaled frequencies (dim/2,) fp32 from the unscaled ones `inv_freq` = base^(-2i/dim).
        `length`: the call's length n (its largest position + 1, a 0-d tensor), which `dynamic` needs."""
        s = self.factor
        if self.kind == "none" or (s == 1.0 and not self.length_dependent):
            return inv_freq
        if self.kind == "linear":
            return inv_freq / s
        if self.kind == "llama3":
            return self._llama3(inv_freq)
        exponent = torch.arange(0, dim, 2, dtype=torch.float32, device=inv_freq.device) / dim  # 2i/d
        if self.kind == "dynamic":
            return self._dynamic(inv_freq, exponent, dim, base, length)
        if self.kind == "ntk":
            # base'^(-2i/d) / base^(-2i/d) = s^(-(2i/d) * d/(d-2)); d = 2 has one frequency (kept)
            return inv_freq * s ** (-exponent * dim / max(dim - 2, 1))
        ramp = self.yarn_ramp(dim, base, inv_freq.device)  # 0: keep theta_i, 1: theta_i / s
        return inv_freq / s * ramp + inv_freq * (1 - ramp)

    def _dynamic(self, inv_freq, exponent, dim: int, base: float, length) -> torch.Tensor:
        """ntk at s' = s * n / L - (s - 1), as a 0-d tensor (no host sync), computed in transformers'
        order (base' = base * s'^(d/(d-2)), then base'^(-2i/d)) so the two agree to the last bit;
        the trained frequencies while n <= L."""
        if length is None:
            raise ValueError("rotary-scaling dynamic needs the call's length")
        n = length.to(device=inv_freq.device, dtype=torch.float32)
        s = self.factor * n / self.original_length - (self.factor - 1)
        scaled = 1.0 / ((base * s ** (dim / max(dim - 2, 1))) ** exponent)
        return torch.where(n > self.original_length, scaled, inv_freq)

    def _llama3(self, inv_freq: torch.Tensor) -> torch.Tensor:
        L, low, high = self.original_length, self.low_freq_factor, self.high_freq_factor
        wavelength = 2 * math.pi / inv_freq
        scaled = torch.where(wavelength > L / low, inv_freq / self.factor, inv_freq)
        blend = (L / wavelength - low) / (high - low)  # 0 at lambda = L / low, 1 at lambda = L / high
        between = (wavelength >= L / high) & (wavelength <= L / low)
        return torch.where(between, (1 - blend) * inv_freq / self.factor + blend * inv_freq, scaled)

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
