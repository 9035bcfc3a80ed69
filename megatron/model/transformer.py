"""One pre-LN transformer layer, every NeoX block shape (DESIGN.md, contract 10):

    sequential (NeoX, Llama):       x = x + drop(attn(LN1(x)));  x = x + drop(mlp(LN2(x)))
    gpt-j-residual (Pythia, 20B):   x = x + drop(attn(LN1(x))) + drop(mlp(LN2(x)))
    ... with gpt-j-tied:            x = x + drop(attn(LN1(x))) + drop(mlp(LN1(x)))

The norm (layernorm / rmsnorm), the MLP's activation (gated or not) and the attention's key/value
heads are options of the parts, chosen by the config."""
from torch import nn

from megatron.model.attention import AttentionContext, SelfAttention
from megatron.model.mlp import MLP
from megatron.model.norms import build_norm


class TransformerLayer(nn.Module):
    def __init__(self, model_cfg, init_method, output_init_method):
        super().__init__()
        self.input_layernorm = build_norm(model_cfg, model_cfg.hidden_size)
        self.attention = SelfAttention(model_cfg, init_method, output_init_method)
        # Kept with gpt-j-tied too (unused there): NeoX builds it, and its checkpoints carry it.
        self.post_attention_layernorm = build_norm(model_cfg, model_cfg.hidden_size)
        self.mlp = MLP(model_cfg, init_method, output_init_method)
        self.dropout = nn.Dropout(model_cfg.hidden_dropout)
        self.parallel_residual = model_cfg.gpt_j_residual
        self.tied_norms = model_cfg.gpt_j_tied

    def forward(self, x, ctx: AttentionContext):  # (B, L, h)
        if self.parallel_residual:
            x1 = self.input_layernorm(x)
            x2 = x1 if self.tied_norms else self.post_attention_layernorm(x)
            attn = self.dropout(self.attention(x1, ctx))
            return x + (self.dropout(self.mlp(x2)) + attn)  # NeoX's order: residual + (mlp + attn)
        x = x + self.dropout(self.attention(self.input_layernorm(x), ctx))
        return x + self.dropout(self.mlp(self.post_attention_layernorm(x)))
