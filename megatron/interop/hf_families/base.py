"""What one Hugging Face family says about itself, in both directions: its stock class and config
class, its tensors (the state-dict adapter: megatron/interop/state_dict_adapter.py), which of our
models it expresses and the config.json that says so, and how its config.json reads back into NeoX
keys (transformers' defaults for the class, its RoPE spellings, its own keys)."""
from __future__ import annotations

import re


class HFFamily:
    arch = ""  # transformers' stock class, config.json's architectures[0]
    name = ""  # the family in messages ("Llama lacks partial rotary")
    config_class = ""  # transformers' configuration class (its defaults are `defaults`)
    model_type = ""  # config.json's model_type
    adapter_class = None  # the StateDictAdapter subclass: our tensors <-> the stock class's
    # Tensors this class's checkpoints may hold that transformers drops on load (rotary frequencies,
    # derived from config.json and rebuilt here too; old causal-mask buffers).
    ignored = re.compile(r".*\.rotary_emb\.inv_freq")
    layers_prefix = ""  # the layers' tensor names start with this, then the layer number
    # transformers' defaults of the keys that change the model (configuration_*.py, 5.23)
    defaults: dict = {}
    # The top-level key transformers reads for each RoPE setting when rope_parameters lacks it (the
    # other families' spellings of the same setting are then ignored by this class: hf_config.py)
    rope_spellings = {"rope_theta": "rope_theta", "partial_rotary_factor": "partial_rotary_factor"}
    every_channel_rotary = False  # rotary turns every channel whatever partial_rotary_factor says

    @property
    def head(self) -> str:
        """The untied output matrix's name (a tied model may still save it)."""
        return self.adapter_class.head

    def adapter(self, model_cfg):
        return self.adapter_class(model_cfg)

    def claims(self, m) -> bool:
        """Whether this family is the one that would express model config `m`'s block (one family
        claims each block shape; `lacks` then says what keeps it from being the stock class)."""
        raise NotImplementedError

    def lacks(self, m) -> list[str]:
        """What model config `m` has that this stock class cannot express ([]: it expresses it)."""
        raise NotImplementedError

    def stock_config(self, m, common: dict, rope: dict) -> dict:
        """config.json for model config `m`: the keys every family writes (`common`), this family's
        own, the RoPE parameters (`rope`) where this class reads them."""
        raise NotImplementedError

    def neox_keys(self, r, heads: int) -> tuple[dict, dict]:
        """(this family's NeoX model keys, {NeoX key: the config.json key it came from}) read from
        config.json through `r` (hf_config's typed reader); `heads`: num_attention_heads."""
        raise NotImplementedError
