"""Adapters at the edge: Hugging Face out (hf_export.py). Reading NeoX / KERPLE checkpoints in is
one layout among others of megatron/checkpoint/ (reader.py, neox.py, neox_keys.py)."""
