"""The tokenizer type names (GPT-NeoX's `tokenizer-type`) and the files each reads: the one list
the config, the tools and build_tokenizer share. No tokenizer library is imported here."""
from __future__ import annotations

TOKENIZER_TYPES = ("GPT2BPETokenizer", "HFTokenizer", "TiktokenTokenizer", "SPMTokenizer", "CharLevelTokenizer")
# NeoX names a config may hold that build_tokenizer refuses with the fix (they would download).
NEOX_ONLY_TYPES = ("HFGPT2Tokenizer",)
# The files each type reads (config keys); a GPT-2 .tiktoken vocab needs no merges.
TOKENIZER_FILES = {"GPT2BPETokenizer": ("vocab_file", "merge_file"), "HFTokenizer": ("vocab_file",),
                   "SPMTokenizer": ("vocab_file",), "TiktokenTokenizer": ("vocab_file",)}
