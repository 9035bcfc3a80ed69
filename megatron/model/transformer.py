"""One pre-LN transformer layer (NeoX, gpt_j_residual=False):

    x = x + drop(attn(LN1(x)))
    x = x + drop(mlp(LN2(x)))
"""
from torch import nn

from megatron.model.attention import AttentionContext, SelfAttention
from megatron.model.mlp import MLP
from megatron.model.norms import build_norm


class TransformerLayer(nn.Module):
    def __init__(self, model_cfg, init_method, output_init_method, parallel=None):
        super().__init__()
        self.input_layernorm = build_norm(model_cfg, model_cfg.hidden_size)
        self.attention = SelfAttention(model_cfg, init_method, output_init_method, parallel)
        self.post_attention_layernorm = build_norm(model_cfg, model_cfg.hidden_size)
        self.mlp = MLP(model_cfg, init_method, output_init_method, parallel)
        self.dropout = nn.Dropout(model_cfg.hidden_dropout)

    def forward(self, x, ctx: AttentionContext):  # (B, L, h)
        x = x + self.dropout(self.attention(self.input_layernorm(x), ctx))
        return x + self.dropout(self.mlp(self.post_attention_layernorm(x)))
