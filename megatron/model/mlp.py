"""The NeoX MLP: dense_h_to_4h -> GELU (exact erf) -> dense_4h_to_h."""
import torch.nn.functional as F
from torch import nn

from megatron.model.linear import column_parallel, row_parallel


class MLP(nn.Module):
    def __init__(self, model_cfg, init_method, output_init_method, parallel=None):
        super().__init__()
        h = model_cfg.hidden_size
        ffn = model_cfg.intermediate_size or 4 * h
        up = nn.Linear(h, ffn, bias=model_cfg.use_bias_in_mlp)
        down = nn.Linear(ffn, h, bias=model_cfg.use_bias_in_mlp)
        init_method(up.weight)
        output_init_method(down.weight)
        for lin in (up, down):
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
        # Built full on every rank (same draws as TP=1), then sharded: h->4h by output
        # features, 4h->h by input features, so GELU runs on this rank's slice with no comms.
        self.dense_h_to_4h = column_parallel(up, parallel)
        self.dense_4h_to_h = row_parallel(down, parallel)

    def forward(self, x):  # (B, L, h)
        return self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(x)))
