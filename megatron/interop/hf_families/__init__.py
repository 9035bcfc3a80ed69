"""One file per Hugging Face family (its stock class): see registry.py."""
from .registry import adapter, families, family

__all__ = ["adapter", "families", "family"]
