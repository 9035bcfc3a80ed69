"""The NeoX MLP: dense_h_to_4h -> activation -> dense_4h_to_h (NeoX's linear1 / linear2).

Widths follow NeoX's sizing rule (ModelConfig.mlp_widths); a gated activation's first projection
holds [x | gate] halves and the activation returns act(gate) * x (megatron/model/activations.py)."""
from torch import nn

from megatron.model.activations import Activation
from megatron.model.linear import column_parallel, row_parallel


class MLP(nn.Module):
    def __init__(self, model_cfg, init_method, output_init_method, parallel=None):
        super().__init__()
        h = model_cfg.hidden_size
        width, inner = model_cfg.mlp_widths
        up = nn.Linear(h, width, bias=model_cfg.use_bias_in_mlp)
        down = nn.Linear(inner, h, bias=model_cfg.use_bias_in_mlp)
        init_method(up.weight)
        output_init_method(down.weight)
        for lin in (up, down):
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
        # Built full on every rank (same draws as TP=1), then sharded: h->4h by output features,
        # 4h->h by input features, so the activation runs on this rank's slice with no comms. A
        # gated MLP's halves are split each on its own, so every rank holds [x | gate] slices.
        groups = (inner, inner) if model_cfg.gated_mlp else None
        self.dense_h_to_4h = column_parallel(up, parallel, groups)
        self.activation = Activation(model_cfg)
        self.dense_4h_to_h = row_parallel(down, parallel)

    def forward(self, x):  # (B, L, h)
        return self.dense_4h_to_h(self.activation(self.dense_h_to_4h(x)))
