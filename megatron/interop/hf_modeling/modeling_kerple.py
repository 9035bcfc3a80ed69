"""Hugging Face causal LM for models exported from the KERPLE/NeoX stack (trust_remote_code).

The same computation as megatron/model (pre-LN NeoX layers; QKV rows per head [q|k|v]; the
positional bias added after the 1/sqrt(d) scaling, before the causal/window mask; exact GELU),
with the same parameter names, so the weights are our state_dict unchanged. kv-cache: HF's
Cache object (`past_key_values.update`) holds the rotated keys (raw ones for a scheme with
rotate_after_cache, xPos, rotated with every call); new queries take positions
past_len + arange(new) and attend to keys 0..past_len+new-1. Standalone: torch + transformers.

Padded batches: `attention_mask` (B, past + L) with one contiguous run of ones per row (left
padding, as generate() pads, and/or right padding, as scoring pads) gives each row's real tokens
what they get alone: padding keys are hidden and each row is seen at its own positions
(mask.py, the training code's own rule, shipped beside this file). `position_ids`, when given
(generate() derives them from the mask), must be those positions at the real tokens.

The positional scheme is megatron/positional's own code: the export copies the scheme's file and
the package files it imports (base.py, distance_kernel.py, ...) next to this one, and writes
positional_scheme.py naming the class, so the bias here is the training code's, not a copy."""
import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from .base import PositionalSpec
from .configuration_kerple import SCHEME_CLASS, KerpleConfig
from .logn import scale_queries
from .mask import allowed_mask, query_blocks, row_positions, row_starts_from_attention_mask
from .registry import instantiate


def build_norm(config):
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.hidden_size, eps=config.rms_norm_epsilon)
    return nn.LayerNorm(config.hidden_size, eps=config.layernorm_epsilon, bias=config.use_bias_in_norms)


class Attention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        h, self.heads = config.hidden_size, config.num_attention_heads
        self.head_dim, self.layer_idx, self.window = h // self.heads, layer_idx, config.attention_window
        self.query_key_value = nn.Linear(h, 3 * h, bias=config.use_bias_in_attn_linear)
        self.dense = nn.Linear(h, h, bias=config.use_bias_in_attn_linear)

    def forward(self, x, positions, q_pos, k_pos, cache, row_starts):
        B, L, _ = x.shape
        q, k, v = self.query_key_value(x).view(B, L, self.heads, 3 * self.head_dim).transpose(1, 2).chunk(3, dim=-1)
        late = positions.rotate_after_cache  # xPos: the cache holds raw keys, rotated per query block
        if not late:
            q, k = positions.rotate_qk(q, k, q_pos, q_pos)  # new keys sit at the new positions
        # log-n scaling, if on (commutes with the rotation), at each row's own positions
        q = scale_queries(q, positions.query_scale(row_positions(q_pos, row_starts), self.window))
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)  # (B, H, past + L, D)
        # A late-rotated scheme holds max_query_span query positions per call (xPos: finite
        # factors); longer calls run in query blocks, as the training code's attention does.
        span = positions.max_query_span(q.dtype) if late else None
        out = torch.cat([self._attend(q[:, :, rows], k[:, :, keys], v[:, :, keys], positions, q_pos[rows], k_pos[keys],
                                      row_starts, late) for rows, keys in query_blocks(q_pos, k_pos, span)], dim=2)
        return self.dense(out.transpose(1, 2).reshape(B, L, -1))

    def _attend(self, q, k, v, positions, q_pos, k_pos, row_starts, late):
        if late:
            q, k = positions.rotate_qk(q, k, q_pos, k_pos)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)  # (B, H, Lq, Lk)
        weight = positions.batch_score_weight(q_pos, k_pos, row_starts)
        if weight is not None:
            scores = scores * weight.to(scores.dtype)
        bias = positions.batch_score_bias(q_pos, k_pos, row_starts)
        if bias is not None:
            scores = scores + bias.to(scores.dtype)
        allowed = allowed_mask(q_pos, k_pos, self.window or None, row_starts)  # (Lq, Lk) / (B, 1, Lq, Lk)
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        return F.softmax(scores, dim=-1).to(v.dtype) @ v  # (B, H, Lq, D)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense_h_to_4h = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.use_bias_in_mlp)
        self.dense_4h_to_h = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.use_bias_in_mlp)

    def forward(self, x):
        return self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(x)))


class Layer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.input_layernorm = build_norm(config)
        self.attention = Attention(config, layer_idx)
        self.post_attention_layernorm = build_norm(config)
        self.mlp = MLP(config)

    def forward(self, x, *args):
        x = x + self.attention(self.input_layernorm(x), *args)
        return x + self.mlp(self.post_attention_layernorm(x))


class KerpleForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = KerpleConfig
    base_model_prefix = "kerple"
    _supports_cache_class = True

    def __init__(self, config):
        super().__init__(config)
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        # The training code's scheme, built from the spec the export recorded (every field,
        # including spec.options, so a scheme's own hyperparameters need no export change).
        self.position = instantiate(SCHEME_CLASS, config.pos_emb, PositionalSpec(**config.positional_spec))
        self.layers = nn.ModuleList(Layer(config, i) for i in range(config.num_hidden_layers))
        self.final_norm = build_norm(config)
        self.output_layer = None if config.tie_output_to_embedding else nn.Linear(
            config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)

    def get_input_embeddings(self):
        return self.word_embeddings

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                use_cache=None, labels=None, return_dict=True, **kwargs):
        B, L = input_ids.shape
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache(config=self.config)
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        q_pos = torch.arange(past, past + L, device=input_ids.device)
        k_pos = torch.arange(past + L, device=input_ids.device)
        row_starts = self._row_starts(attention_mask, position_ids, q_pos)
        x = self.word_embeddings(input_ids)
        absolute = self.position.embed(row_positions(q_pos, row_starts))
        if absolute is not None:
            x = x + absolute.to(x.dtype)
        for layer in self.layers:
            x = layer(x, self.position, q_pos, k_pos, past_key_values, row_starts)
        x = self.final_norm(x)
        w = self.word_embeddings.weight if self.output_layer is None else self.output_layer.weight
        logits = F.linear(x, w)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten())
        return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=past_key_values)

    @staticmethod
    def _row_starts(attention_mask, position_ids, q_pos):
        """Each row's first real position from attention_mask (None: nothing left-padded), with
        position_ids checked against the positions that implies at the real tokens."""
        starts = None
        if attention_mask is not None:
            if attention_mask.shape[-1] < int(q_pos[-1]) + 1:
                raise ValueError(f"attention_mask covers {attention_mask.shape[-1]} tokens, but the cache and "
                                 f"input hold {int(q_pos[-1]) + 1}: pass the mask of every token so far")
            starts = row_starts_from_attention_mask(attention_mask[:, : int(q_pos[-1]) + 1])
        if position_ids is not None:
            want = row_positions(q_pos, starts)
            want = want.expand(position_ids.shape[0], -1) if want.dim() == 1 else want
            real = (q_pos[None, :] >= (starts[:, None] if starts is not None else 0)).expand_as(want)
            if not torch.equal(position_ids.to(want.device)[real], want[real]):
                raise ValueError("position_ids must count each row's tokens from 0 at its first real token "
                                 "(what attention_mask implies); other position layouts are not supported")
        return starts
