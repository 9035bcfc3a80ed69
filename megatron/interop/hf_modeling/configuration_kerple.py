"""Hugging Face config for models exported from the KERPLE/NeoX stack (tools/export_hf.py).

Standalone (torch + transformers only): copied next to the weights for trust_remote_code."""
from transformers import PretrainedConfig

# The exported scheme's class, re-exported for modeling_kerple.py. Importing it here is what gives
# every distinct scheme its own config class: transformers keys remote model classes by config
# class and reuses the first model class loaded for one, and a remote module's identity is the
# hash of its file and its relative imports. So two exports loaded in one process never share a
# model class built for the other's scheme.
from .positional_scheme import SCHEME_CLASS

__all__ = ["KerpleConfig", "SCHEME_CLASS"]


class KerpleConfig(PretrainedConfig):
    model_type = "kerple_neox"

    def __init__(self, vocab_size=50304, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=None, max_position_embeddings=2048, pos_emb="kerple_log",
                 rotary_pct=1.0, rotary_emb_base=10000, rpe_num_buckets=32, rpe_max_distance=128,
                 attention_window=None, norm="layernorm", layernorm_epsilon=1e-5, rms_norm_epsilon=1e-8,
                 use_bias_in_norms=True, use_bias_in_attn_linear=True, use_bias_in_mlp=True,
                 tie_output_to_embedding=False, positional_spec=None, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size or 4 * hidden_size
        self.max_position_embeddings = max_position_embeddings
        self.pos_emb = pos_emb
        # megatron.positional.base.PositionalSpec's fields (the scheme is built from them)
        self.positional_spec = positional_spec
        self.rotary_pct = rotary_pct
        self.rotary_emb_base = rotary_emb_base
        self.rpe_num_buckets = rpe_num_buckets
        self.rpe_max_distance = rpe_max_distance
        self.attention_window = attention_window  # query i sees keys i-W < j <= i
        self.norm = norm
        self.layernorm_epsilon = layernorm_epsilon
        self.rms_norm_epsilon = rms_norm_epsilon
        self.use_bias_in_norms = use_bias_in_norms
        self.use_bias_in_attn_linear = use_bias_in_attn_linear
        self.use_bias_in_mlp = use_bias_in_mlp
        # Our own flag, not HF's tie_word_embeddings: the logits read word_embeddings.weight
        # directly, so no HF tying machinery is involved.
        self.tie_output_to_embedding = tie_output_to_embedding
        kwargs["tie_word_embeddings"] = False
        super().__init__(**kwargs)
