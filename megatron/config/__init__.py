"""Configuration: NeoX flat YAML keys -> typed, validated sections.

    cfg = load_config(["a.yml", "b.yml"], overrides={"train-iters": 10})
    cfg.model.num_layers, cfg.training.train_iters, cfg.precision.dtype, ...

Each key is declared once (with its doc) in its section's file; docs/config.md is generated from
those declarations by tools/gen_config_docs.py.
"""
from megatron.config.errors import ConfigError
from megatron.config.neox import NeoXConfig, load_config
from megatron.config.schema import all_keys

__all__ = ["ConfigError", "NeoXConfig", "all_keys", "load_config"]
