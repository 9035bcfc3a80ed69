"""Interop with checkpoints and tools from elsewhere: NeoX / KERPLE checkpoints in
(neox_checkpoint.py), Hugging Face out (hf_export.py), safe loading (safe_load.py)."""
