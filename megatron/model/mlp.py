"""The NeoX MLP: dense_h_to_4h -> GELU (exact erf) -> dense_4h_to_h."""
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    def __init__(self, mcfg, init_method, output_init_method):
        super().__init__()
        h = mcfg.hidden_size
        ffn = mcfg.intermediate_size or 4 * h
        self.dense_h_to_4h = nn.Linear(h, ffn, bias=mcfg.use_bias_in_mlp)
        self.dense_4h_to_h = nn.Linear(ffn, h, bias=mcfg.use_bias_in_mlp)
        init_method(self.dense_h_to_4h.weight)
        output_init_method(self.dense_4h_to_h.weight)
        for lin in (self.dense_h_to_4h, self.dense_4h_to_h):
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    def forward(self, x):  # (B, L, h)
        return self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(x)))
