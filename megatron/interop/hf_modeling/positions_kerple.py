"""Every positional scheme of the KERPLE/NeoX stack, as one module with the same four hooks as
megatron/positional (embed, rotate, bias, weight) and the same parameter names, so the exported
safetensors keys are `position.<name>` exactly as in our checkpoints. Positions are absolute, so
kv-cache rows need no special case. Standalone: torch only."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EPS, P_MAX = 1e-2, 2.0


def alibi_slopes(n):
    def power_of_2(m):
        start = 2 ** (-(2 ** -(math.log2(m) - 3)))
        return [start * start**i for i in range(m)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + alibi_slopes(2 * closest)[0::2][: n - closest]


def inv_freq(dim, base):
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))


def pow_distance(d, p):
    positive = d > 0
    d_safe = torch.where(positive, d, torch.ones_like(d))
    return torch.where(positive, torch.exp(p * torch.log(d_safe)), torch.zeros_like(d_safe * p))


def t5_bucket(n, num_buckets, max_distance):
    max_exact = num_buckets // 2
    n_large = n.clamp_min(max_exact).to(torch.float32)
    large = max_exact + (torch.log(n_large / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).to(torch.long)
    return torch.where(n < max_exact, n, large.clamp_max(num_buckets - 1))


class Positions(nn.Module):
    def __init__(self, config):
        super().__init__()
        name, H = config.pos_emb, config.num_attention_heads
        self.name, self.config = name, config
        head_dim = config.hidden_size // H
        self.bias_keys, self.weight_keys = (), ()
        if name == "learned":
            self.weight = nn.Parameter(torch.zeros(config.max_position_embeddings, config.hidden_size))
        elif name == "sinusoidal":
            self.register_buffer("inv_freq", inv_freq(config.hidden_size, 10000.0))
        elif name == "rotary":
            self.rotary_ndims = int(head_dim * config.rotary_pct)
            self.register_buffer("inv_freq", inv_freq(self.rotary_ndims, config.rotary_emb_base))
        elif name == "alibi":
            self.register_buffer("slopes", torch.tensor(alibi_slopes(H))[:, None, None])
        elif name == "rpe":
            self.weight = nn.Parameter(torch.zeros(config.rpe_num_buckets, H))
        elif name in ("kerple_log", "kerple_log_3para"):
            self.bias_keys = ("bias_p", "bias_a") + (("bias_r",) if name.endswith("3para") else ())
        elif name == "kerple_power_original":
            self.bias_keys = ("bias_a",)
        elif name.startswith("kerple_power"):
            bias_arg, wei_arg = name.split("_")[-2:]
            self.bias_keys = tuple(f"bias_{c}" for c in "pa" if c in bias_arg)
            self.weight_keys = tuple(f"wei_{c}" for c in "pa" if c in wei_arg)
        elif name != "none":
            raise ValueError(f"unknown pos_emb {name!r}")
        for key in self.bias_keys + self.weight_keys:
            self.register_parameter(key, nn.Parameter(torch.ones(H, 1, 1)))

    def _c(self, key):
        """Parameter clamped into its domain: >= 1e-2; power exponents (and 3para's r) <= 2."""
        x = getattr(self, key).float()
        capped = key == "bias_r" or (self.name.startswith("kerple_power") and key.endswith("_p"))
        return x.clamp(min=EPS, max=P_MAX if capped else None)

    def embed(self, pos):
        if self.name == "learned":
            return F.embedding(pos, self.weight)
        if self.name == "sinusoidal":
            ang = pos.float()[:, None] * self.inv_freq.float()[None, :]
            return torch.cat([ang.sin(), ang.cos()], dim=-1)
        return None

    def rotate(self, q, k, q_pos, k_pos):
        if self.name != "rotary" or self.rotary_ndims == 0:
            return q, k
        return self._rot(q, q_pos), self._rot(k, k_pos)

    def _rot(self, x, pos):
        nd = self.rotary_ndims
        freqs = pos.float()[:, None] * self.inv_freq.float()[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        xr, xp = x[..., :nd].float(), x[..., nd:]
        x1, x2 = xr.chunk(2, dim=-1)
        xr = xr * emb.cos() + torch.cat([-x2, x1], dim=-1) * emb.sin()
        return torch.cat([xr.to(x.dtype), xp], dim=-1)

    def bias(self, q_pos, k_pos):  # (H, Lq, Lk) float32 or None
        d = (q_pos[:, None].float() - k_pos[None, :].float()).clamp_min(0.0)
        if self.name == "alibi":
            return -self.slopes.float() * d
        if self.name == "rpe":
            n = (q_pos[:, None] - k_pos[None, :]).clamp_min(0)
            b = t5_bucket(n, self.config.rpe_num_buckets, self.config.rpe_max_distance)
            head_dim = self.config.hidden_size // self.config.num_attention_heads
            return F.embedding(b, self.weight.float()).permute(2, 0, 1) * math.sqrt(head_dim)
        if self.name == "kerple_log":
            return -self._c("bias_p") * torch.log1p(self._c("bias_a") * d)
        if self.name == "kerple_log_3para":
            return -self._c("bias_p") * torch.log1p(self._c("bias_a") * pow_distance(d, self._c("bias_r")))
        if self.bias_keys:
            return -self._power(d, "bias")
        return None

    def weight_kernel(self, q_pos, k_pos):
        if not self.weight_keys:
            return None
        d = (q_pos[:, None].float() - k_pos[None, :].float()).clamp_min(0.0)
        return torch.exp(-self._power(d, "wei"))

    def _power(self, d, kind):
        keys = self.bias_keys if kind == "bias" else self.weight_keys
        x = pow_distance(d, self._c(f"{kind}_p")) if f"{kind}_p" in keys else d[None]
        return self._c(f"{kind}_a") * x if f"{kind}_a" in keys else x
