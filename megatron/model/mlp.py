"""The NeoX MLP: dense_h_to_4h -> activation -> dense_4h_to_h (NeoX's linear1 / linear2).

Widths follow NeoX's sizing rule (ModelConfig.mlp_widths); a gated activation's first projection
holds [x | gate] halves and the activation returns act(gate) * x (megatron/model/activations.py)."""
from torch import nn

from megatron.model.activations import Activation


class MLP(nn.Module):
    def __init__(self, model_cfg, init_method, output_init_method):
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
        self.dense_h_to_4h = up
        self.activation = Activation(model_cfg)
        self.dense_4h_to_h = down
        # A gated MLP's first projection holds [x | gate] row groups: a tensor-parallel split keeps
        # each group's share on every rank, so the activation runs on a rank's slice with no comms.
        self.up_groups = (inner, inner) if model_cfg.gated_mlp else None

    def forward(self, x):  # (B, L, h)
        return self.dense_4h_to_h(self.activation(self.dense_h_to_4h(x)))
